"""Where each layer's state lives: the engine allocates it from the layers' declarations.

A layer declares what it keeps per token in the engine (`LayerSpec.state()`: `KVPages` for a `gqa`
layer, `LatentPages` for an `mla` layer, None for a layer that keeps nothing); `allocate` builds one
store per declaring layer over the engine's slots. In a trainer forward the packed batch's own rows are
the store (`PackedKV`).
"""

import torch
from torch import Tensor

from .spec import KVPages, LatentPages, ModelSpec


class PackedKV:
    """Trainer forwards: the keys of the packed batch itself are the key store (slot = packed row)."""

    def store(self, k: Tensor, v: Tensor, write_slots: Tensor | None) -> tuple[Tensor, Tensor]:
        return k, v

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


def allocate(spec: ModelSpec, num_slots: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """One store per layer, in layer order (None for a layer that declares no state), NaN-filled so a
    read of a slot no forward has written poisons the row instead of passing silently."""
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
        else:
            raise ValueError(f"the engine cannot allocate state {type(declared).__name__} yet")
    return tuple(stores)


def packed_state(spec: ModelSpec) -> tuple:
    """The trainer's per-layer state: the packed batch's own keys for every layer."""
    return tuple(PACKED if layer.state() is not None else None for layer in spec.layers)
