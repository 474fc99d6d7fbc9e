"""Admission trials for `gdn.conv` and `gdn.core`: every row of every form and case vs its sequence
computed alone.

The forms are attention's (ops/attention/probe.py), over a recurrent cache instead of KV pages:
trainer cases run packed batches without a cache (several compositions and orders, contiguous and
strided inputs), each sequence from position 0; `engine_prefill` runs chunked prefill into a cache of
slots handed out in shuffled order, with spare slots, every slot poisoned (NaN/±inf) until written;
`engine_decode` runs the same cache one token per sequence per step, staggered and in lockstep, and
after a prefill by `engine_prefill` that stops at a chunk boundary or inside a chunk. The reference
for a sequence is its rows computed alone in the anchor case's simplest form: packed, one whole-sequence
prefill, or token by token.

gdn.core's lengths cross its chunk boundaries (1, C - 1, C, C + 1, 2C + 5, and 3C + 2 where C is
small enough for the reference's row loop), so decode rows fall at every offset of a chunk and
prefill chunks end on, before and after a boundary. Its hazards (`_core_hazards`) sit in v (signed
zeros, subnormals, ties, huge values) and in the gates (softplus above its threshold, β saturated at 0
and 1), all finite: a row that is NaN in both sides would compare its payloads. gdn.conv's lengths
straddle its kernel width; `hazard_rows` go into x, across prefill chunk ends and at a sequence's start
where the window reads the zeros before position 0.
"""

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from ...validate.battery import Trial, hazard_rows, strided
from ..attention.forms import decode_spans, prefill_spans
from ..common import torch_dtype
from . import reference
from .reference import SOFTPLUS_THRESHOLD

POISON = (float("nan"), float("inf"), float("-inf"))
NUM_SPARE_SLOTS = 2  # cache slots no sequence owns: they stay poisoned
DEFAULT_CHUNK_SIZE = 64
# The probe's own widths, for a contract fitted to no model: more value heads than key heads.
CORE_DIMS = dict(num_k_heads=2, num_v_heads=4, k_head_dim=16, v_head_dim=8)
CONV_DIM, CONV_KERNEL = 24, 4
# gdn.conv's hazard rows, by sequence length: across the end of the first 16-token prefill chunk, and
# from position 0, where the window also reads the zeros before the sequence.
CONV_HAZARD_AT = {70: 13, 17: 0}
# The reference computes gdn.core row by row on the host; above this chunk size the 3C sequence is left
# out so one dtype pass stays a few seconds on a CPU.
MAX_CHUNK_FOR_3C = 32


@dataclass
class _Setup:
    """One op's side of the probe: its sequences, how a call is spelled, its cache, its form sizes."""

    seqs: list[dict[str, Tensor]]  # per sequence: input name -> [L, ...], one row per token
    arguments: Callable  # (tokens: dict, cache: tuple | None, state_ids, positions) -> the op's arguments
    new_cache: Callable  # (num_slots) -> the poisoned cache tensors
    prefill_chunks: tuple[int, ...]  # engine_prefill's chunk sizes, besides the whole sequence
    cuts: tuple[int, ...]  # where the prefill before a decode stops, cycled over the sequences

    def length(self, i: int) -> int:
        return next(iter(self.seqs[i].values())).shape[0]


def _poisoned(ctx, shape, dtype) -> Tensor:
    numel = torch.Size(shape).numel()
    return torch.tensor(POISON)[torch.arange(numel) % len(POISON)].reshape(shape).to(dtype).to(ctx.device)


def _tokens(setup, spans) -> dict[str, Tensor]:
    """The inputs of the (i, start, stop) token ranges, back to back."""
    return {name: torch.cat([setup.seqs[i][name][start:stop] for i, start, stop in spans]) for name in setup.seqs[0]}


def _positions(ctx, spans) -> Tensor:
    return torch.cat([torch.arange(start, stop) for _, start, stop in spans]).to(ctx.device)


def _split(out, spans):
    return out.split([stop - start for _, start, stop in spans])


def _packed(ctx, case, setup, order, non_contiguous=False):
    """The sequences `order` packed back to back, each from position 0, no cache; -> {i: output}."""
    spans = [(i, 0, setup.length(i)) for i in order]
    tokens = _tokens(setup, spans)
    if non_contiguous:
        tokens = {name: strided(t) for name, t in tokens.items()}
    out = ctx.call(case, *setup.arguments(tokens, None, None, _positions(ctx, spans)))
    return {i: part for (i, _, _), part in zip(spans, _split(out, spans))}


def _engine(ctx, setup, order, steps):
    """Run the steps over one poisoned cache whose slots are a shuffled pick with spares; `steps` lists
    (case, spans), spans the (i, start, stop) token ranges of one call. -> {i: output}."""
    num_slots = len(order) + NUM_SPARE_SLOTS
    cache = setup.new_cache(num_slots)
    slot = dict(zip(order, torch.randperm(num_slots, generator=ctx.generator).tolist()))
    pieces = {i: [] for i in order}
    for case, spans in steps:
        state_ids = torch.cat([torch.full((stop - start,), slot[i]) for i, start, stop in spans]).to(ctx.device)
        out = ctx.call(case, *setup.arguments(_tokens(setup, spans), cache, state_ids, _positions(ctx, spans)))
        for (i, _, _), part in zip(spans, _split(out, spans)):
            pieces[i].append(part)
    return {i: torch.cat(pieces[i]) for i in order}


def _prefill(ctx, case, setup, order, chunk):
    spans = prefill_spans({i: setup.length(i) for i in order}, order, chunk)
    return _engine(ctx, setup, order, [(case, step) for step in spans])


def _decode(ctx, case, setup, order, stagger, cut=None):
    """Token by token; with `cut` (i -> tokens), first one `engine_prefill` call of each sequence's first
    `cut[i]` tokens, the decode continuing from there."""
    cut = cut or {i: 0 for i in order}
    steps = [("engine_prefill", [(i, 0, cut[i]) for i in order if cut[i]])] if any(cut.values()) else []
    left = decode_spans({i: setup.length(i) - cut[i] for i in order}, order, stagger)
    steps += [(case, [(i, cut[i] + start, cut[i] + stop) for i, start, stop in step]) for step in left if step]
    return _engine(ctx, setup, order, steps)


def _forms(ctx, case, setup, order):
    """(label, run) for every form that `case` serves, each run giving {sequence index: output}."""
    if ctx.role[case] == "trainer":
        yield "packed", lambda: _packed(ctx, case, setup, order)
        yield "packed in reverse order", lambda: _packed(ctx, case, setup, order[::-1])
        yield "packed, non-contiguous inputs", lambda: _packed(ctx, case, setup, order, non_contiguous=True)
        for part in (order[1::2], order[::2]):
            yield f"packed subset {[setup.length(i) for i in part]}", lambda part=part: _packed(ctx, case, setup, part)
    elif case == "engine_decode":
        yield "decode, staggered starts", lambda: _decode(ctx, case, setup, order, stagger=3)
        yield "decode in lockstep, reverse order", lambda: _decode(ctx, case, setup, order[::-1], stagger=0)
        if "engine_prefill" in ctx.ops:
            cut = {i: min(setup.length(i) - 1, setup.cuts[n % len(setup.cuts)]) for n, i in enumerate(order)}
            label = f"decode after engine_prefill of {[cut[i] for i in order]} tokens, staggered starts"
            yield label, lambda: _decode(ctx, case, setup, order, stagger=5, cut=cut)
    else:
        longest = max(setup.length(i) for i in order)
        for chunk in dict.fromkeys((*setup.prefill_chunks, longest)):
            yield f"prefill in chunks of {chunk}", lambda chunk=chunk: _prefill(ctx, case, setup, order, chunk)
        first = setup.prefill_chunks[0]
        yield f"prefill in chunks of {first}, reverse order", lambda: _prefill(ctx, case, setup, order[::-1], first)


def _alone(ctx, setup, i) -> Tensor:
    """Sequence i computed by itself in the anchor case's simplest form."""
    case = ctx.anchor
    if ctx.role[case] == "trainer":
        return _packed(ctx, case, setup, [i])[i]
    if case == "engine_decode":
        return _decode(ctx, case, setup, [i], stagger=0)[i]
    return _prefill(ctx, case, setup, [i], setup.length(i))[i]


def _trials(ctx, setup):
    order = list(range(len(setup.seqs)))
    alone = {i: _alone(ctx, setup, i) for i in order}
    for case in ctx.cases:
        for form, run in _forms(ctx, case, setup, order):
            for i, out in run().items():
                yield Trial(f"{case}, {form}: sequence #{i} (length {setup.length(i)}) vs alone", alone[i], out)
    empty = torch.empty(0, dtype=torch.int64, device=ctx.device)
    tokens = _tokens(setup, [(0, 0, 0)])
    for case in ctx.cases:
        engine = ctx.role[case] != "trainer"
        cache = setup.new_cache(NUM_SPARE_SLOTS) if engine else None
        out = ctx.call(case, *setup.arguments(tokens, cache, empty if engine else None, empty))
        yield Trial(f"{case}, empty batch", alone[0][:0], out)


def _conv_dims(ctx) -> tuple[int, int]:
    """(D, W): the probe's own, or the fitted model's conv_dim and conv_kernel (`ctx.geometry["gdn"]`)."""
    model = ctx.geometry.get("gdn")
    return (model["conv_dim"], model["conv_kernel"]) if model else (CONV_DIM, CONV_KERNEL)


def conv(ctx, lengths=None):
    """The trials of `gdn.conv`; `lengths` replaces the default (kernel-width-straddling) lengths."""
    num_dims, width = _conv_dims(ctx)
    lengths = lengths or tuple(n for n in (70, 1, width - 1, width, width + 1, 17, 40) if n > 0)
    seqs = [{"x": ctx.randn(n, num_dims)} for n in lengths]
    for seq in seqs:
        x = seq["x"]
        if len(x) in CONV_HAZARD_AT:
            at = CONV_HAZARD_AT[len(x)]
            rows = hazard_rows(ctx, num_dims)[: len(x) - at]  # [6, D]
            x[at : at + len(rows)] = rows
    weight_dtype = torch_dtype(ctx.constants["weight_dtype"]) if "weight_dtype" in ctx.constants else ctx.dtype
    weight = ctx.randn(num_dims, width, scale=0.7, dtype=weight_dtype)

    def arguments(tokens, cache, state_ids, positions):
        return tokens["x"], weight, cache[0] if cache else None, state_ids, positions

    def new_cache(num_slots):
        return (_poisoned(ctx, (num_slots, width - 1, num_dims), ctx.dtype),)

    chunks = tuple(dict.fromkeys((16, max(1, width - 1), 2, 7, 23)))
    setup = _Setup(seqs, arguments, new_cache, chunks, cuts=(16, max(1, width - 1), 1, 2 * width + 1))
    yield from _trials(ctx, setup)


def _core_dims(ctx) -> dict:
    """Hk, Hv, Dk, Dv: the probe's own, or the fitted model's (`ctx.geometry["gdn"]`)."""
    model = ctx.geometry.get("gdn")
    return {name: model[name] for name in CORE_DIMS} if model else dict(CORE_DIMS)


def _core_hazards(ctx, seq, at: int) -> None:
    """Values that break careless kernels, from row `at`: v rows of signed zeros, subnormals, huge values
    and ties (`hazard_rows`); gates beyond saturation, one kind per value head (h mod 4): a above
    softplus's threshold (g huge, the decay underflows to 0), a far below it (g ≈ -0, no decay), b of
    ±1e30 (β exactly 1 or 0); then a run of tied keys. Heads of the other kinds keep their memory, so
    the state carried across the chunk boundary still matters."""
    v, a, b = seq["v"], seq["a"], seq["b"]
    rows = hazard_rows(ctx, v[0].numel()).reshape(-1, *v.shape[1:])[: v.shape[0] - at]  # [6, Hv, Dv]
    v[at : at + len(rows)] = rows
    gates = slice(at, at + len(rows))
    kind = torch.arange(a.shape[1], device=a.device) % 4
    a[gates] = torch.where(kind == 0, 2 * SOFTPLUS_THRESHOLD, torch.where(kind == 1, -4 * SOFTPLUS_THRESHOLD, a[gates].float())).to(a.dtype)
    b[gates] = torch.where(kind == 2, 1e30, torch.where(kind == 3, -1e30, b[gates].float())).to(b.dtype)
    stop = at + len(rows)
    seq["k"][stop : stop + 8] = seq["k"][stop - 1 : stop]


def core(ctx, lengths=None):
    """The trials of `gdn.core`; `lengths` replaces the default (chunk-boundary-crossing) lengths."""
    d = _core_dims(ctx)
    chunk_size = ctx.constants.get("chunk_size", DEFAULT_CHUNK_SIZE)
    if lengths is None:
        several = (2 * chunk_size + 5, 3 * chunk_size + 2) if chunk_size <= MAX_CHUNK_FOR_3C else (2 * chunk_size + 5,)
        lengths = tuple(n for n in (*several, 1, chunk_size - 1, chunk_size, chunk_size + 1, 5) if n > 0)
    hk, hv, dk, dv = d["num_k_heads"], d["num_v_heads"], d["k_head_dim"], d["v_head_dim"]
    # Across the first chunk boundary, and from position 0 (against the zero state); the rest stay clean.
    hazard_at = {2 * chunk_size + 5: max(0, chunk_size - 3), chunk_size + 1: 0, 5: 0}
    seqs = []
    for n in lengths:
        seq = dict(q=ctx.randn(n, hk, dk), k=ctx.randn(n, hk, dk), v=ctx.randn(n, hv, dv), a=ctx.randn(n, hv), b=ctx.randn(n, hv))
        if n in hazard_at:
            _core_hazards(ctx, seq, hazard_at[n])
        seqs.append(seq)
    a_log = ctx.randn(hv, scale=0.5, dtype=torch.float32)
    dt_bias = ctx.randn(hv, scale=0.5, dtype=torch.float32)

    def arguments(tokens, cache, state_ids, positions):
        state, rows = cache or (None, None)
        return (*(tokens[name] for name in "qkvab"), a_log, dt_bias, state, rows, state_ids, positions)

    row_width = ctx.impl.row_width if ctx.impl is not None and ctx.impl.row_width is not None else reference.row_width

    def new_cache(num_slots):
        return (_poisoned(ctx, (num_slots, hv, dk, dv), torch.float32),
                _poisoned(ctx, (num_slots, chunk_size, hv, row_width(hv, dk, dv, ctx.constants)), torch.float32))

    chunks = tuple(dict.fromkeys(c for c in (chunk_size, 2 * chunk_size, 7, chunk_size + 7, chunk_size - 1) if c > 0))
    cuts = (chunk_size, max(1, chunk_size - 1), 1, max(1, chunk_size // 2), chunk_size + 3)
    yield from _trials(ctx, _Setup(seqs, arguments, new_cache, chunks, cuts))
