"""Per-forward metadata, set and reset in one place so training, prefill and decode share one model.

The model's forward takes only `(input_ids, positions)`; everything that differs between the cases
travels in a `Step` made current by `with step(...)`: which bound ops to call, the batch layout the
caller declares (`PackedBatch` for the trainer, `PagedBatch` for the engine) and each layer's state
(`model/state.py`). The layout is declared, never rediscovered from the tensors.
"""

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ..ops.attention.metadata import packed_slot_table, paged_slot_table


@dataclass(frozen=True)
class PackedBatch:
    """Whole sequences packed back to back; each sequence's keys are its own rows (the trainer)."""

    positions: Tensor  # [T] position of each token in its sequence
    seq_ids: Tensor  # [T] sequence of each token
    slot_table: Tensor  # [B, L] key j of sequence b -> packed row
    cu_seqlens: Tensor  # [B + 1]
    max_seqlen: int  # the longest sequence, known on the host
    write_slots = None

    @classmethod
    def of(cls, lengths: list[int], device) -> "PackedBatch":
        cu_seqlens = torch.tensor([0, *lengths], device=device).cumsum(0)
        slot_table, seq_ids, positions = packed_slot_table(cu_seqlens)
        return cls(positions, seq_ids, slot_table, cu_seqlens, max(lengths))

    @property
    def packed_len(self) -> int:
        return self.max_seqlen


@dataclass(frozen=True)
class PagedBatch:
    """Tokens of several sequences over the engine's paged slots: any mix of prefill chunks (cut at any
    token) and decodes. The same integers vLLM keeps per step: the slot mapping and the block table."""

    positions: Tensor  # [T] absolute position of each token
    seq_ids: Tensor  # [T] row of the block table of each token
    slot_table: Tensor  # [B, L] key j of sequence b -> slot
    write_slots: Tensor  # [T] slot each token's state is written to (vLLM's slot_mapping)
    state_ids: Tensor | None = None  # [T] each token's sequence slot, for layers with per-sequence state
    packed_len = None

    @classmethod
    def of(cls, block_table: Tensor, page_size: int, num_keys: int, seq_ids: Tensor, positions: Tensor,
           state_ids: Tensor | None = None) -> "PagedBatch":
        """block_table [B, P] page ids (-1 past a sequence's pages); num_keys: the most keys any row reads."""
        slot_table = paged_slot_table(block_table, page_size, num_keys)
        return cls(positions, seq_ids, slot_table, slot_table[seq_ids, positions], state_ids)


@dataclass
class Step:
    """What one forward needs beyond token ids and positions."""

    case: str
    ops: dict[str, Callable]  # contract op name -> bound impl for this case
    batch: PackedBatch | PagedBatch
    state: tuple  # per layer: its store (model/state.py), or None
    labels: Tensor | None = None  # [T] request_id << 32 | position of each token, for tracing
    routing: Tensor | None = None  # [T, layers, k] int64, `routing_buffer`: each MoE layer copies its expert ids in


def routing_buffer(spec, num_tokens: int, device) -> Tensor | None:
    """Where a forward records which experts each token went to: [T, num_hidden_layers, spec.routing_width]
    int64 of -1, left -1 in dense layers and past a layer's own top_k. The layers write it with a device
    copy, never a host sync, so a captured CUDA graph records too. None for a model without MoE layers."""
    if not spec.routing_width:
        return None
    return torch.full((num_tokens, spec.num_hidden_layers, spec.routing_width), -1, dtype=torch.int64, device=device)


_current: list[Step] = []
_tracers: list = []


@contextlib.contextmanager
def tracing(tracer):
    """While active, every step's ops are wrapped by `tracer.wrap(ops, case)` (see audit/trace.py)."""
    _tracers.append(tracer)
    try:
        yield tracer
    finally:
        _tracers.pop()


def is_tracing() -> bool:
    return bool(_tracers)


@contextlib.contextmanager
def step(current: Step):
    """Make `current` the step the model reads; exception-safe and nestable."""
    if _tracers:
        current = dataclasses.replace(current, ops=_tracers[-1].wrap(current.ops, current.case))
    _current.append(current)
    try:
        yield current
    finally:
        _current.pop()


def current_step() -> Step:
    if not _current:
        raise RuntimeError("the model was called outside `with step(...)`: it needs the case, ops and batch layout")
    return _current[-1]
