"""A call's runs (stretches of tokens with consecutive positions and one slot), found on the host once for every
GDN op of a forward: every impl's input checks (`check_runs`), the runs the reference and native walk, the Triton
core's run starts (`candidates`) and chunk-piece tables.

Each host read of the positions or slots is a host sync: the GPU drains its queue, then idles while the host
enqueues what follows. A GDN layer's ops used to read them several times each (the checks' minima, maxima and
masks, the run starts' nonzero) and every layer again. Here one read serves all: `find_runs` keeps the last
call's runs while the next call passes the same positions (and state ids) object unchanged — its identity and its
version counter, which every in-place write bumps — as every GDN layer of a model's forward and the backward do
(inference tensors have no version counter: their runs are found again each call). A write that bypasses the
counter (a kernel of one's own writing into the tensor's memory, `.data`) is not seen: pass a new tensor then.
The facts the checks need are computed on the host with the runs, so the checks read nothing more."""

from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor


class Runs(NamedTuple):
    starts: Tensor  # [R] int32 on the positions' device: each run's first token
    first: np.ndarray  # the same on the host
    first_positions: np.ndarray  # each run's first token's position
    first_slots: np.ndarray | None  # each run's state id, None without state ids
    min_position: int  # the smallest position (0 for no tokens)
    slots: tuple[int, int] | None  # the smallest and largest state id, None without state ids (or tokens)
    slot_jumps: bool  # whether consecutive tokens of one slot have positions that are not consecutive
    slot_in_two_runs: bool  # whether a slot heads two runs of the call
    tables: dict  # pieces(...)'s results for these runs, by their arguments


_last: tuple | None = None  # (weakref to positions, its version, weakref to state ids or None, its version, Runs)


def _same(t: Tensor | None, ref, version) -> bool:
    return (t is None and ref is None) or (t is not None and ref is not None and ref() is t and t._version == version)


def find_runs(positions: Tensor, state_ids: Tensor | None) -> Runs | None:
    """The call's runs, from one read of the positions (and state ids) to the host and one copy of the starts to
    the device; the last call's again for the same, unchanged tensors; None while a CUDA graph is captured (no
    host reads then)."""
    global _last
    if positions.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    # An inference tensor (torch.inference_mode, as vLLM runs models) has no version counter: never kept.
    keep = not positions.is_inference() and (state_ids is None or not state_ids.is_inference())
    if keep and _last is not None and _same(positions, *_last[0:2]) and _same(state_ids, *_last[2:4]):
        return _last[4]
    both = positions.long() if state_ids is None else torch.stack((positions.long(), state_ids.long()))
    host = both.cpu().numpy()
    pos, ids = (host, None) if state_ids is None else (host[0], host[1])
    jump = pos[1:] != pos[:-1] + 1
    same_slot = None if ids is None else ids[1:] == ids[:-1]
    breaks = jump if ids is None else jump | ~same_slot
    first = np.flatnonzero(np.concatenate(([True], breaks)))
    tokens = pos.shape[0] > 0
    runs = Runs(
        starts=to_device(first.astype(np.int32), positions.device),
        first=first,
        first_positions=pos[first] if tokens else np.zeros(1, dtype=np.int64),
        first_slots=ids[first] if ids is not None and tokens else None,
        min_position=int(pos.min()) if tokens else 0,
        slots=(int(ids.min()), int(ids.max())) if ids is not None and tokens else None,
        slot_jumps=bool((same_slot & jump).any()) if ids is not None else False,
        slot_in_two_runs=bool(ids is not None and tokens and np.unique(ids[first]).shape[0] != first.shape[0]),
        tables={},
    )
    _last = None if not keep else (weakref.ref(positions), positions._version, None if state_ids is None else weakref.ref(state_ids),
                                   None if state_ids is None else state_ids._version, runs)
    return runs


def to_device(array: np.ndarray, device: torch.device) -> Tensor:
    """A host array on `device`: from pinned memory without waiting on the device."""
    t = torch.from_numpy(array)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def pieces(runs: Runs, chunk_size: int, num_tokens: int, from_offsets: bool = True) -> tuple[tuple[Tensor, ...], int]:
    """The call's chunk pieces, each run starting at its position's chunk offset (from_offsets), or at offset 0: per
    run (first token, length, first piece id), per piece (its run, the token at its chunk's offset 0, the offsets
    [off, stop) it computes), int32 each on the device, and the number of pieces. Built on the host once for the
    runs (as some twenty small torch ops a call, the table took more host time than the kernels it feeds took on
    the GPU: 0.7 ms at 2 x 4096 tokens) and copied in one transfer, each table 16-byte aligned in it (the kernels'
    pointer arguments keep one specialisation)."""
    key = (chunk_size, num_tokens, from_offsets)
    if key in runs.tables:
        return runs.tables[key]
    first = runs.first.astype(np.int64)
    off = runs.first_positions.astype(np.int64) % chunk_size if from_offsets else np.zeros_like(first)
    length = np.diff(first, append=num_tokens)
    count_of = (off + length + chunk_size - 1) // chunk_size
    chunk0 = np.cumsum(count_of) - count_of
    count = int(count_of.sum())
    run = np.repeat(np.arange(first.shape[0]), count_of)
    index = np.arange(count) - chunk0[run]  # the piece's place in its run
    tok0 = first[run] - off[run] + index * chunk_size
    piece_off = np.where(index == 0, off[run], 0)
    stop = np.minimum(off[run] + length[run] - index * chunk_size, chunk_size)
    tables = (first, length, chunk0, run, tok0, piece_off, stop)
    at = np.cumsum([0] + [-(-t.shape[0] // 4) * 4 for t in tables])
    packed = np.zeros(at[-1], dtype=np.int32)
    for table, start in zip(tables, at):
        packed[start : start + table.shape[0]] = table
    on_device = to_device(packed, runs.starts.device)
    runs.tables[key] = tuple(on_device[start : start + table.shape[0]] for table, start in zip(tables, at)), count
    return runs.tables[key]
