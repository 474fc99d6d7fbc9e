"""Admission trials for `attention`: every row of every form and case vs its sequence computed alone.

Forms follow the case's role: trainer cases run packed variable-length batches (several
compositions and orders); `engine_prefill` runs chunked prefill over a paged KV cache whose pages are
allocated in shuffled order and whose unwritten slots hold NaN/±inf (so future keys of the current
block are poison too); `engine_decode` runs the same cache one token per sequence per step, with the
sequences starting at staggered steps so the decode batch keeps changing. The reference for a
sequence is its rows computed alone in the anchor case's form.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ...validate.battery import Trial, strided
from .metadata import UNUSED_SLOT, packed_slot_table, paged_slot_table

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 16  # the probe's own heads, for a contract fitted to no model
LENGTHS = (70, 1, 40, 16, 17, 15)
WINDOW, WINDOW_LENGTHS = 20, (70, 40, 17)
POISON = (float("nan"), float("inf"), float("-inf"))
# The page size (and the chunk unit) of the probe's engine forms, in units of the impl's key block;
# impls without a block size (native) get this one.
DEFAULT_BLOCK_N = 16


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


def _packed(ctx, case, seqs, order, window, non_contiguous=False):
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


class _PagedCache:
    """A KV cache of pages of `page_size` slots, handed out in shuffled order, poisoned until written."""

    def __init__(self, ctx, seqs, order, page_size):
        pages_per_seq = [-(-len(seqs[i]) // page_size) for i in order]
        num_pages = sum(pages_per_seq) + 2  # spare pages nobody owns stay poisoned
        pages = torch.randperm(num_pages, generator=ctx.generator)
        block_table = torch.full((len(order), max(pages_per_seq)), UNUSED_SLOT, dtype=torch.int64)
        taken = 0
        for row, count in enumerate(pages_per_seq):
            block_table[row, :count] = pages[taken : taken + count]
            taken += count
        self.slot_table = paged_slot_table(block_table, page_size, block_table.shape[1] * page_size).to(ctx.device)  # [B, L]
        _, num_kv_heads, head_dim = heads(ctx)
        poison = torch.tensor(POISON)[torch.arange(num_pages * page_size * num_kv_heads * head_dim) % len(POISON)]
        self.k = poison.reshape(num_pages * page_size, num_kv_heads, head_dim).to(ctx.dtype).to(ctx.device)  # [S, Hkv, D]
        self.v = self.k.clone()
        self.row = {i: row for row, i in enumerate(order)}

    def write(self, seq: Sequence, i: int, start: int, stop: int) -> None:
        slots = self.slot_table[self.row[i], start:stop]
        self.k[slots], self.v[slots] = seq.k[start:stop], seq.v[start:stop]


def _engine_steps(ctx, case, seqs, order, window, page_size, spans):
    """Run `case` over a paged cache, one call per step; `spans[step]` lists (i, start, stop): the
    query tokens of sequence i in that step, whose keys are written to the cache just before."""
    cache = _PagedCache(ctx, seqs, order, page_size)
    pieces = {i: [] for i in order}
    for step in spans:
        for i, start, stop in step:
            cache.write(seqs[i], i, start, stop)
        q = torch.cat([seqs[i].q[start:stop] for i, start, stop in step])
        seq_ids = torch.cat([torch.full((stop - start,), cache.row[i]) for i, start, stop in step]).to(ctx.device)
        positions = torch.cat([torch.arange(start, stop) for i, start, stop in step]).to(ctx.device)
        out = ctx.call(case, q, cache.k, cache.v, cache.slot_table, seq_ids, positions, _scale(ctx), window)
        for (i, start, stop), part in zip(step, out.split([stop - start for _, start, stop in step])):
            pieces[i].append(part)
    return {i: torch.cat(pieces[i]) for i in order}


def prefill_spans(lengths: dict[int, int], order, chunk: int) -> list[list[tuple[int, int, int]]]:
    """Chunked prefill's steps: every sequence of `order` advances by `chunk` tokens a step, all in one
    batch; a step lists (sequence, start, stop) query ranges. `lengths`: sequence -> its length."""
    longest = max(lengths[i] for i in order)
    return [[(i, s, min(s + chunk, lengths[i])) for i in order if s < lengths[i]] for s in range(0, longest, chunk)]


def decode_spans(lengths: dict[int, int], order, stagger: int) -> list[list[tuple[int, int, int]]]:
    """Token-by-token decode's steps; sequence number n of `order` starts at step n * stagger."""
    starts = {i: n * stagger for n, i in enumerate(order)}
    last = max(starts[i] + lengths[i] for i in order)
    return [[(i, s - starts[i], s - starts[i] + 1) for i in order if 0 <= s - starts[i] < lengths[i]] for s in range(last)]


def _prefill(ctx, case, seqs, order, window, chunk, page_size=None):
    spans = prefill_spans({i: len(seqs[i]) for i in order}, order, chunk)
    return _engine_steps(ctx, case, seqs, order, window, page_size or _block_n(ctx), spans)


def _decode(ctx, case, seqs, order, window, stagger):
    return _engine_steps(ctx, case, seqs, order, window, _block_n(ctx), decode_spans({i: len(seqs[i]) for i in order}, order, stagger))


def _block_n(ctx) -> int:
    return ctx.constants.get("block_n", DEFAULT_BLOCK_N)


def _forms(ctx, case, seqs, order, window):
    """(label, run) for every form that `case` serves, each run giving {sequence index: output}."""
    block_n = _block_n(ctx)
    if ctx.role[case] == "trainer":
        yield "packed", lambda: _packed(ctx, case, seqs, order, window)
        yield "packed in reverse order", lambda: _packed(ctx, case, seqs, order[::-1], window)
        yield "packed, non-contiguous q", lambda: _packed(ctx, case, seqs, order, window, non_contiguous=True)
        for part in (order[1::2], order[::2]):
            yield f"packed subset {[len(seqs[i]) for i in part]}", lambda part=part: _packed(ctx, case, seqs, part, window)
    elif case == "engine_decode":
        yield "decode, staggered starts", lambda: _decode(ctx, case, seqs, order, window, stagger=3)
        yield "decode in lockstep, reverse order", lambda: _decode(ctx, case, seqs, order[::-1], window, stagger=0)
    else:
        longest = max(len(seqs[i]) for i in order)
        for chunk in dict.fromkeys((block_n, 2 * block_n, 7, block_n + 7, longest)):
            yield f"prefill in chunks of {chunk}", lambda chunk=chunk: _prefill(ctx, case, seqs, order, window, chunk)
        yield f"prefill in chunks of {block_n}, reverse order", lambda: _prefill(ctx, case, seqs, order[::-1], window, block_n)
        yield f"prefill in chunks of 7, pages of {2 * block_n}", lambda: _prefill(ctx, case, seqs, order, window, 7, 2 * block_n)
        # Pages smaller than a key block: a block's keys come from several pages, chunks start anywhere.
        small = max(1, block_n // 2)
        yield f"prefill in chunks of 5, pages of {small}", lambda: _prefill(ctx, case, seqs, order, window, 5, small)


def _alone(ctx, seqs, i, window) -> Tensor:
    """Sequence i computed by itself in the anchor case's simplest form."""
    case = ctx.anchor
    if ctx.role[case] == "trainer":
        return _packed(ctx, case, seqs, [i], window)[i]
    if case == "engine_decode":
        return _decode(ctx, case, seqs, [i], window, stagger=0)[i]
    return _prefill(ctx, case, seqs, [i], window, len(seqs[i]))[i]


def _trials(ctx, seqs, order, window, label):
    alone = {i: _alone(ctx, seqs, i, window) for i in order}
    for case in ctx.cases:
        for form, run in _forms(ctx, case, seqs, order, window):
            for i, out in run().items():
                yield Trial(f"{label}{case}, {form}: sequence #{i} (length {len(seqs[i])}) vs alone", alone[i], out)
    return alone


def probe(ctx, lengths=LENGTHS, window_lengths=WINDOW_LENGTHS):
    """The trials; smaller `lengths` / `window_lengths` (each a subset of the other) make a quicker
    probe for Triton's interpreter, losing the hazards of the lengths left out (see HAZARDS)."""
    seqs = _sequences(ctx, lengths)
    alone = yield from _trials(ctx, seqs, list(range(len(seqs))), None, "")
    window_order = [lengths.index(n) for n in window_lengths]
    yield from _trials(ctx, seqs, window_order, WINDOW, f"window {WINDOW}: ")
    empty = torch.empty(0, dtype=torch.int64, device=ctx.device)
    k, v = seqs[0].k, seqs[0].v
    slot_table = packed_slot_table(torch.tensor([0, len(seqs[0])], device=ctx.device))[0]
    for case in ctx.cases:
        out = ctx.call(case, seqs[0].q[:0], k, v, slot_table, empty, empty, _scale(ctx), None)
        yield Trial(f"{case}, empty query batch", alone[0][:0], out)
