"""Per-forward metadata, set and reset in one place so training, prefill and decode share one model.

The model's forward takes only `(input_ids, positions)`; everything that differs between the cases —
which bound ops to call, where each token's keys live, which sequence a token belongs to — travels in
a `Step` made current by `with step(...)`.
"""

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Callable

from torch import Tensor


class PackedKV:
    """Trainer forwards: the keys of the packed batch itself are the key store (slot = packed row)."""

    def store(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k, v


class PagedKV:
    """Engine forwards: this forward's keys are written to `write_slots` of the paged cache, and the
    whole cache is the key store."""

    def __init__(self, k_cache: Tensor, v_cache: Tensor, write_slots: Tensor):
        self.k_cache, self.v_cache, self.write_slots = k_cache, v_cache, write_slots  # [layers, S, Hkv, D]

    def store(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k_cache[layer].index_copy_(0, self.write_slots, k.to(self.k_cache.dtype))
        self.v_cache[layer].index_copy_(0, self.write_slots, v.to(self.v_cache.dtype))
        return self.k_cache[layer], self.v_cache[layer]


@dataclass
class Step:
    """What one forward needs beyond token ids and positions."""

    case: str
    ops: dict[str, Callable]  # contract op name -> bound impl for this case
    slot_table: Tensor  # [B, L] key position -> key store row, per sequence
    seq_ids: Tensor  # [T] sequence (row of slot_table) of each token
    kv: PackedKV | PagedKV
    labels: Tensor | None = None  # [T] request_id << 32 | position of each token, for tracing


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
        raise RuntimeError("the model was called outside `with step(...)`: it needs the case, ops and key layout")
    return _current[-1]
