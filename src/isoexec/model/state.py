"""Where each layer's state lives: the engine allocates it from the layers' declarations.

A layer declares what it keeps in the engine (`LayerSpec.state()`: `KVPages` for a `gqa` layer and
`LatentPages` for an `mla` layer, per token; `RecurrentState` for a `gdn` layer, per sequence; None for a
layer that keeps nothing); `allocate` builds one store per declaring layer, over the engine's token slots
or its sequence slots. In a trainer forward the packed batch's own rows are the store (`PackedKV`), and a
recurrent layer starts every sequence from a zero state.
"""

from typing import Callable

import torch
from torch import Tensor

from .spec import KVPages, LatentPages, ModelSpec, RecurrentState


class PackedKV:
    """Trainer forwards: the keys of the packed batch itself are the key store (slot = packed row)."""

    def store(self, k: Tensor, v: Tensor, write_slots: Tensor | None) -> tuple[Tensor, Tensor]:
        return k, v

    def cache(self, write_slots: Tensor | None) -> None:
        """Where a fused launch writes k and v itself: nowhere, the keys are the batch's own."""
        return None

    def store_latent(self, rows: Tensor, write_slots: Tensor | None) -> Tensor:
        return rows


PACKED = PackedKV()


class PagedKV:
    """One layer's keys and values in the engine's slots: k, v [S, Hkv, D]. A forward writes its keys
    to `write_slots` (the slot mapping) and attends over the whole store."""

    def __init__(self, k: Tensor, v: Tensor):
        self.k, self.v = k, v

    def store(self, k: Tensor, v: Tensor, write_slots: Tensor) -> tuple[Tensor, Tensor]:
        self.k.index_copy_(0, write_slots, k.to(self.k.dtype))
        self.v.index_copy_(0, write_slots, v.to(self.v.dtype))
        return self.k, self.v

    def cache(self, write_slots: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(k, v, write_slots): what `store` writes to, for a launch that writes the rows itself
        (`ops/rope/qk_triton.py`) exactly as `store` would."""
        return self.k, self.v, write_slots

    def poison(self) -> None:
        self.k.fill_(float("nan"))
        self.v.fill_(float("nan"))


class PagedLatent:
    """One `mla` layer's cached rows in the engine's slots: [S, width] (latent, then rope key)."""

    def __init__(self, rows: Tensor):
        self.rows = rows

    def store_latent(self, rows: Tensor, write_slots: Tensor) -> Tensor:
        self.rows.index_copy_(0, write_slots, rows.to(self.rows.dtype))
        return self.rows

    def poison(self) -> None:
        self.rows.fill_(float("nan"))


class RecurrentSlots:
    """One `gdn` layer's state per sequence slot (`batch.state_ids` names each token's): conv [N, W - 1, D]
    in the model dtype, the fp32 state at each open chunk's start [N, Hv, Dk, Dv] and the open chunk's
    rows [N, C, Hv, width] fp32, `width` floats per value head as the contract's gdn.core impl keeps them
    (its `row_width`, ops/gdn/). A sequence at position 0 starts from zeros whatever its slot holds, so a
    slot is reused without clearing."""

    # Each token's slot: None here, where the engine's batch names them (`batch.state_ids`); a store over another
    # engine's slots may number them itself (isoexec.vllm.state: vLLM numbers them per group of layers).
    state_ids = None

    def __init__(self, declared: RecurrentState, num_sequences: int, chunk_size: int, width: int, dtype: torch.dtype,
                 device: torch.device):
        nan = float("nan")
        self.conv = torch.full((num_sequences, declared.conv_kernel - 1, declared.conv_dim), nan, dtype=dtype, device=device)
        self.state = torch.full((num_sequences, declared.num_v_heads, declared.k_head_dim, declared.v_head_dim), nan, dtype=torch.float32,
                                device=device)
        self.rows = torch.full((num_sequences, chunk_size, declared.num_v_heads, width), nan, dtype=torch.float32, device=device)

    def poison(self) -> None:
        for t in (self.conv, self.state, self.rows):
            t.fill_(float("nan"))


def allocate(spec: ModelSpec, num_slots: int, dtype: torch.dtype, device: torch.device, num_sequences: int = 0,
             chunk_size: int | None = None, row_width: Callable[[int, int, int], int] | None = None) -> tuple:
    """One store per layer, in layer order (None for a layer that declares no state), NaN-filled so a
    read of a slot no forward has written poisons the row instead of passing silently: token-slot stores
    of `num_slots`, sequence-slot stores of `num_sequences` (recurrent layers, whose open chunks hold
    `chunk_size` rows of `row_width(Hv, Dk, Dv)` floats per value head: the contract's constant and its
    gdn.core impl's layout)."""
    stores = []
    for layer in spec.layers:
        declared = layer.state()
        if declared is None:
            stores.append(None)
        elif isinstance(declared, KVPages):
            k = torch.full((num_slots, declared.num_kv_heads, declared.head_dim), float("nan"), dtype=dtype, device=device)
            stores.append(PagedKV(k, torch.full_like(k, float("nan"))))
        elif isinstance(declared, LatentPages):
            stores.append(PagedLatent(torch.full((num_slots, declared.width), float("nan"), dtype=dtype, device=device)))
        elif isinstance(declared, RecurrentState):
            if num_sequences < 1 or chunk_size is None or row_width is None:
                raise ValueError("a recurrent (gdn) layer keeps its state per sequence: allocate needs num_sequences, the contract's "
                                 "chunk_size and its gdn.core impl's row_width")
            width = row_width(declared.num_v_heads, declared.k_head_dim, declared.v_head_dim)
            stores.append(RecurrentSlots(declared, num_sequences, chunk_size, width, dtype, device))
        else:
            raise ValueError(f"the engine cannot allocate state {type(declared).__name__} yet")
    return tuple(stores)


def packed_state(spec: ModelSpec) -> tuple:
    """The trainer's per-layer state: the packed batch's own keys for every layer."""
    return tuple(PACKED if layer.state() is not None else None for layer in spec.layers)
