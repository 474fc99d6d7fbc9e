"""Admission trials for `attention`: every row of every form and case vs its sequence computed alone.

The forms (`forms.py`) follow the case's role: trainer cases run packed variable-length batches
(several compositions and orders); `engine_prefill` runs chunked prefill over a paged KV cache whose
pages are allocated in shuffled order and whose unwritten slots hold NaN/±inf (so future keys of the
current block are poison too); `engine_decode` runs the same cache one token per sequence per step,
with the sequences starting at staggered steps so the decode batch keeps changing. The reference for a
sequence is its rows computed alone in the anchor case's form. Each form runs without a window and
with one (`WINDOW`) over the longer sequences."""

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from ...validate.battery import Trial, strided
from .forms import alone, engine_steps, forms
from .metadata import packed_slot_table

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 16  # the probe's own heads, for a contract fitted to no model
LENGTHS = (70, 1, 40, 16, 17, 15)
WINDOW, WINDOW_LENGTHS = 20, (70, 40, 17)


def heads(ctx) -> tuple[int, int, int]:
    """(H, Hkv, D) of the probe's sequences. For a contract fitted to a model (`ctx.geometry`), that
    model's head_dim and query heads per KV head, over at most two KV heads: kernels choose their MMA
    shapes from those (at head_dim 128 an H200 gave 16-row and 64-row tiles of attention.triton other
    last bits, which head_dim 16 did not show), while more KV heads only add programs."""
    if not ctx.geometry:
        return NUM_HEADS, NUM_KV_HEADS, HEAD_DIM
    kv_heads = min(2, ctx.geometry["num_kv_heads"])
    return ctx.geometry["num_heads"] // ctx.geometry["num_kv_heads"] * kv_heads, kv_heads, ctx.geometry["head_dim"]


def _scale(ctx) -> float:
    return heads(ctx)[2] ** -0.5


@dataclass
class Sequence:
    q: Tensor  # [L, H, D]
    k: Tensor  # [L, Hkv, D]
    v: Tensor  # [L, Hkv, D]

    def __len__(self) -> int:
        return self.q.shape[0]


def _signed_zero_and_ties(ctx, q, k, v):
    """Row 31's output is -0.0 (with 16-key blocks): negative values in keys [0, 16), then scores so
    large that alpha = 0 (acc = -x * 0 = -0.0) against values of -0.0 in [16, 32). An impl that lets
    a block the row does not see touch its state (acc * 1 + 0) turns that into +0.0. Then a run of
    identical keys (tied scores) and more values of -0.0."""
    v[:16] = -v[:16].abs()
    q[31] = q[31].abs()
    k[16:32], v[16:32] = 64.0, -0.0
    k[40:56] = k[40]
    v[56:66] = -0.0
    return q, k, v


def _subnormals(ctx, q, k, v):
    tiny = torch.finfo(ctx.dtype).tiny
    k[::3] = (k[::3].float() * tiny / 4).to(ctx.dtype)
    v[1::2] = (v[1::2].float() * tiny / 4).to(ctx.dtype)
    return q, k, v


def _huge(ctx, q, k, v):
    """Scores near 1e30: every key but the row's maximum underflows exp; values near 1e30 too."""
    v[::2] = (v[::2].float() * 1e30).to(ctx.dtype)
    return q, (k.float() * 1e30).to(ctx.dtype), v


def _zeros_only(ctx, q, k, v):
    """Keys of ±0.0 (every score ties at ±0) and values of -0.0: every output is a sum of zeros."""
    k = torch.where(torch.rand(k.shape, generator=ctx.generator) < 0.5, 0.0, -0.0).to(ctx.dtype).to(ctx.device)
    return q, k, torch.full_like(v, -0.0)


HAZARDS = {70: _signed_zero_and_ties, 40: _subnormals, 16: _huge, 17: _zeros_only}


def _sequences(ctx, lengths) -> list[Sequence]:
    """One sequence per length in `lengths`, most of them carrying a hazard in their keys/values."""
    seqs, (num_heads, num_kv_heads, head_dim) = [], heads(ctx)
    for length in lengths:
        q = ctx.randn(length, num_heads, head_dim)
        k, v = ctx.randn(length, num_kv_heads, head_dim), ctx.randn(length, num_kv_heads, head_dim)
        if length in HAZARDS:
            q, k, v = HAZARDS[length](ctx, q, k, v)
        seqs.append(Sequence(q, k, v))
    return seqs


def _packed(ctx, seqs, window, case, order, non_contiguous=False):
    """The sequences `order` packed back to back, as a trainer batch; -> {sequence index: [L, H, D]}."""
    lengths = torch.tensor([len(seqs[i]) for i in order])
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(ctx.device)
    slot_table, seq_ids, positions = packed_slot_table(cu_seqlens)
    q = torch.cat([seqs[i].q for i in order])
    k, v = torch.cat([seqs[i].k for i in order]), torch.cat([seqs[i].v for i in order])
    # The trainer declares its batch packed (the longest sequence), as the model passes it.
    packed_len = int(lengths.max()) if window is None else None
    out = ctx.call(case, strided(q) if non_contiguous else q, k, v, slot_table, seq_ids, positions, _scale(ctx), window, packed_len)
    parts = out.split(lengths.tolist())
    return {i: part for i, part in zip(order, parts)}


def _steps(ctx, seqs, window, case, order, spans, page_size):
    """The engine's calls over a paged KV cache (`forms.engine_steps`)."""
    _, num_kv_heads, head_dim = heads(ctx)

    def call(cache, step, seq_ids, positions):
        q = torch.cat([seqs[i].q[start:stop] for i, start, stop in step])
        k, v = cache.fields["k"], cache.fields["v"]
        return ctx.call(case, q, k, v, cache.slot_table, seq_ids, positions, _scale(ctx), window)

    shapes = {"k": (num_kv_heads, head_dim), "v": (num_kv_heads, head_dim)}
    return engine_steps(ctx, seqs, order, page_size, spans, shapes, call)


def _trials(ctx, seqs, order, window, label):
    lengths = {i: len(seqs[i]) for i in range(len(seqs))}
    packed, steps = partial(_packed, ctx, seqs, window), partial(_steps, ctx, seqs, window)
    rows_alone = {i: alone(ctx, lengths, i, packed, steps) for i in order}
    for case in ctx.cases:
        for form, run in forms(ctx, case, lengths, order, packed, steps, strided="q"):
            for i, out in run().items():
                yield Trial(f"{label}{case}, {form}: sequence #{i} (length {len(seqs[i])}) vs alone", rows_alone[i], out)
    return rows_alone


def probe(ctx, lengths=LENGTHS, window_lengths=WINDOW_LENGTHS):
    """The trials; smaller `lengths` / `window_lengths` (each a subset of the other) make a quicker
    probe for Triton's interpreter, losing the hazards of the lengths left out (see HAZARDS)."""
    seqs = _sequences(ctx, lengths)
    rows_alone = yield from _trials(ctx, seqs, list(range(len(seqs))), None, "")
    window_order = [lengths.index(n) for n in window_lengths]
    yield from _trials(ctx, seqs, window_order, WINDOW, f"window {WINDOW}: ")
    empty = torch.empty(0, dtype=torch.int64, device=ctx.device)
    k, v = seqs[0].k, seqs[0].v
    slot_table = packed_slot_table(torch.tensor([0, len(seqs[0])], device=ctx.device))[0]
    for case in ctx.cases:
        out = ctx.call(case, seqs[0].q[:0], k, v, slot_table, empty, empty, _scale(ctx), None)
        yield Trial(f"{case}, empty query batch", rows_alone[0][:0], out)
