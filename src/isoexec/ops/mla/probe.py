"""Admission trials for `mla`: every row of every form and case vs its sequence computed alone.

The forms are attention's (ops/attention/probe.py): trainer cases run packed variable-length batches
(several compositions and orders, contiguous and strided inputs); `engine_prefill` runs chunked
prefill over a paged latent store whose pages are allocated in shuffled order and whose unwritten
slots hold NaN/±inf; `engine_decode` runs the same store one token per sequence per step, with
staggered starts so the decode batch keeps changing. Lengths cross page and chunk boundaries. The
reference for a sequence is its rows computed alone in the anchor case's form.

Keys and values of MLA both come from one cached row, so the hazards are written into the rows: the
rope key makes scores, the latent the values (see HAZARDS).
"""

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from ...validate.battery import Trial, strided
from ..attention.forms import alone, engine_steps, forms
from ..attention.metadata import packed_slot_table

LENGTHS = (70, 1, 40, 16, 17, 15)


@dataclass(frozen=True)
class Dims:
    num_heads: int
    nope: int  # dn
    rope: int  # dr
    rank: int  # r
    value: int  # dv


def dims(ctx) -> Dims:
    """The probe's own small heads for a contract fitted to no model; else the fitted model's
    (`ctx.geometry["mla"]`), whose widths decide the reductions' block counts and kernels' tiles. All of
    its heads: every head reads the one shared latent row, so a kernel packs heads and queries into a
    tile by the head count (20 heads fill 3 queries of a 64-row tile), as attention's do by the group."""
    model = ctx.geometry.get("mla")
    if not model:
        return Dims(num_heads=4, nope=16, rope=8, rank=32, value=16)
    return Dims(model["num_heads"], model["qk_nope_head_dim"], model["qk_rope_head_dim"], model["kv_lora_rank"],
                model["v_head_dim"])


@dataclass
class Sequence:
    q_nope: Tensor  # [L, H, dn]
    q_rope: Tensor  # [L, H, dr]
    rows: Tensor  # [L, r + dr]: latent, then rope key

    def __len__(self) -> int:
        return self.q_nope.shape[0]


def _signed_zero_and_ties(ctx, d, seq):
    """Row 31's latent output is -0.0 (with 16-key blocks): negative latents in keys [0, 16), then rope
    keys so large that alpha = 0 (acc = -x * 0 = -0.0) against latents of -0.0 in [16, 32); head 0's
    W_UV is positive (`_weight`), so its output stays -0.0. An impl that lets a block the row does not
    see touch its state turns that into +0.0. Then a run of identical rows (tied scores) and more
    latents of -0.0."""
    rows, r = seq.rows, d.rank
    rows[:16, :r] = -rows[:16, :r].abs()
    seq.q_rope[31] = seq.q_rope[31].abs()
    rows[16:32, :r], rows[16:32, r:] = -0.0, 256.0
    rows[40:56] = rows[40]
    rows[56:66, :r] = -0.0


def _subnormals(ctx, d, seq):
    tiny = torch.finfo(ctx.dtype).tiny
    seq.rows[::3] = (seq.rows[::3].float() * tiny / 4).to(ctx.dtype)


def _huge(ctx, d, seq):
    """Scores and values near 1e30: every key but the row's maximum underflows exp."""
    seq.rows.copy_((seq.rows.float() * 1e30).to(ctx.dtype))


def _zeros_only(ctx, d, seq):
    """Rows of ±0.0 only: every score ties at ±0 and every value is a signed zero."""
    signs = torch.rand(seq.rows.shape, generator=ctx.generator) < 0.5
    seq.rows.copy_(torch.where(signs, 0.0, -0.0).to(ctx.dtype))


HAZARDS = {70: _signed_zero_and_ties, 40: _subnormals, 16: _huge, 17: _zeros_only}


def _sequences(ctx, lengths) -> list[Sequence]:
    d, seqs = dims(ctx), []
    for length in lengths:
        seq = Sequence(ctx.randn(length, d.num_heads, d.nope), ctx.randn(length, d.num_heads, d.rope), ctx.randn(length, d.rank + d.rope))
        if length in HAZARDS:
            HAZARDS[length](ctx, d, seq)
        seqs.append(seq)
    return seqs


def _weight(ctx) -> Tensor:
    """kv_b_proj.weight [H * (dn + dv), r]; head 0's W_UV positive, so a -0.0 latent output stays -0.0."""
    d = dims(ctx)
    weight = ctx.randn(d.num_heads, d.nope + d.value, d.rank, scale=d.rank**-0.5)
    weight[0, d.nope :] = weight[0, d.nope :].abs()
    return weight.flatten(0, 1)


def _scale(ctx) -> float:
    d = dims(ctx)
    return (d.nope + d.rope) ** -0.5


def _packed(ctx, seqs, weight, case, order, non_contiguous=False):
    """The sequences `order` packed back to back, as a trainer batch; -> {sequence index: [L, H, dv]}."""
    lengths = torch.tensor([len(seqs[i]) for i in order])
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(ctx.device)
    slot_table, seq_ids, positions = packed_slot_table(cu_seqlens)
    tensors = [torch.cat([getattr(seqs[i], name) for i in order]) for name in ("q_nope", "q_rope", "rows")]
    if non_contiguous:
        tensors = [strided(t) for t in tensors]
    out = ctx.call(case, *tensors, weight, slot_table, seq_ids, positions, _scale(ctx), int(lengths.max()))
    return dict(zip(order, out.split(lengths.tolist())))


def _steps(ctx, seqs, weight, case, order, spans, page_size):
    """The engine's calls over a paged latent store (`forms.engine_steps`)."""

    def call(store, step, seq_ids, positions):
        q_nope = torch.cat([seqs[i].q_nope[start:stop] for i, start, stop in step])
        q_rope = torch.cat([seqs[i].q_rope[start:stop] for i, start, stop in step])
        return ctx.call(case, q_nope, q_rope, store.fields["rows"], weight, store.slot_table, seq_ids, positions, _scale(ctx))

    shapes = {"rows": (seqs[order[0]].rows.shape[1],)}
    return engine_steps(ctx, seqs, order, page_size, spans, shapes, call)


def probe(ctx, lengths=LENGTHS):
    """The trials; smaller `lengths` make a quicker probe, losing the hazards of the lengths left out."""
    seqs, weight = _sequences(ctx, lengths), _weight(ctx)
    order = list(range(len(seqs)))
    by_index = {i: len(seqs[i]) for i in order}
    packed, steps = partial(_packed, ctx, seqs, weight), partial(_steps, ctx, seqs, weight)
    rows_alone = {i: alone(ctx, by_index, i, packed, steps) for i in order}
    for case in ctx.cases:
        for form, run in forms(ctx, case, by_index, order, packed, steps, strided="q and rows"):
            for i, out in run().items():
                yield Trial(f"{case}, {form}: sequence #{i} (length {len(seqs[i])}) vs alone", rows_alone[i], out)
    empty = torch.empty(0, dtype=torch.int64, device=ctx.device)
    slot_table = packed_slot_table(torch.tensor([0, len(seqs[0])], device=ctx.device))[0]
    for case in ctx.cases:
        out = ctx.call(case, seqs[0].q_nope[:0], seqs[0].q_rope[:0], seqs[0].rows, weight, slot_table, empty, empty, _scale(ctx))
        yield Trial(f"{case}, empty query batch", rows_alone[0][:0], out)
