"""Admission trials for the MoE regions: a token's routing, its expert outputs and their sum must be
the token's alone, whatever shares the batch. Hazards: exact ties in router scores (duplicate gate
rows), every token choosing one expert, experts no token chose, single tokens, decode-sized and
prefill-sized batches, and the probe rows inside a batch of 1,000."""

import dataclasses

import torch

from ...validate.battery import Trial, hazard_rows, rowwise
from ..common import torch_dtype

HIDDEN, EXPERTS, TOP_K, INTERMEDIATE = 40, 6, 2, 24
SIZES = (1, 2, 3, 7, 16, 33, 64, 200)
LARGE_BATCH = 1000


def in_large_batch(ctx, batched: list, extra: list, *shared, label: str = "", **kwargs):
    """The probe rows `batched` as the first rows of a larger batch (`extra` fills the rest) vs as a
    batch of their own, in every case; `rowwise` ties the latter to each row alone."""
    rows = batched[0].shape[0]
    own = ctx.call(ctx.anchor, *batched, *shared, **kwargs)
    tag = f"{label}: " if label else ""
    for case in ctx.cases:
        big = ctx.call(case, *[torch.cat([b, e]) for b, e in zip(batched, extra)], *shared, **kwargs)
        yield Trial(f"{tag}{case}, rows 0..{rows - 1} of a batch of {big.shape[0]} vs a batch of {rows}", own, big[:rows])


def _packed(op):
    """(weights [T, k], ids [T, k]) as one [T, 2k] float32 tensor (ids are small ints, exact in fp32)."""

    def call(*args, **kwargs):
        weights, ids = op(*args, **kwargs)
        return torch.cat([weights, ids.to(weights.dtype)], dim=-1)

    return call


def _tokens(ctx, count: int):
    return torch.cat([ctx.randn(count, HIDDEN, scale=2.0), hazard_rows(ctx, HIDDEN)])


def _model_shapes(ctx):
    """(experts, moe_intermediate_size, top_k, hidden) of each MoE layer shape of the model the contract
    was fitted to (`ctx.geometry`): the tiles must hold there too, where a program's loops have the
    model's trip counts and a token's experts are as many and as spread as the model's."""
    return [(e, i, k, ctx.geometry["hidden_size"]) for e, i, k in ctx.geometry.get("moe", ())]


# At a model's shape: 24 tokens and the hazard rows alone and in batches of decode size, then among
# 1,000 tokens (about 60 routed rows an expert at 128 experts, top-8: a prefill chunk's spread).
MODEL_SIZES, MODEL_COUNT, MODEL_LARGE = (1, 7, 30), 24, 1000


# Each probe takes its sizes as keywords, so that the Triton interpreter's tests can run it smaller.
def router(ctx, *, count: int = 194, sizes=SIZES, large: int = LARGE_BATCH):
    x = _tokens(ctx, count)
    gate = ctx.randn(EXPERTS * 2, HIDDEN, scale=0.3)
    gate[3] = gate[1]  # experts 1 and 3 score exactly alike: a tie at every token
    packed = dataclasses.replace(ctx, ops={case: _packed(op) for case, op in ctx.ops.items()})
    extra = ctx.randn(large - x.shape[0], HIDDEN, scale=2.0)
    for label, args in (("softmax top-2", (None, TOP_K, "softmax", True)),
                        ("softmax top-1, unnormalised", (None, 1, "softmax", False)),
                        ("sigmoid, bias, 4 groups keep 2, top-3, scaled", (ctx.randn(EXPERTS * 2, scale=0.1, dtype=torch.float32), 3,
                                                                          "sigmoid", True, 4, 2, 2.5))):
        yield from rowwise(packed, [x], gate, *args, sizes=sizes, label=label)
        yield from in_large_batch(packed, [x], [extra], gate, *args, label=label)
    for num_experts, _, top_k, hidden in _model_shapes(ctx):
        x = torch.cat([ctx.randn(MODEL_COUNT, hidden), hazard_rows(ctx, hidden)])
        gate = ctx.randn(num_experts, hidden, scale=hidden**-0.5)
        gate[3] = gate[1]
        label = f"{num_experts} experts, hidden {hidden}, top-{top_k}"
        yield from rowwise(packed, [x], gate, None, top_k, sizes=MODEL_SIZES, label=label)
        yield from in_large_batch(packed, [x], [ctx.randn(MODEL_LARGE - x.shape[0], hidden)], gate, None, top_k, label=label)


def experts(ctx, *, count: int = 194, sizes=SIZES, large: int = LARGE_BATCH):
    x = _tokens(ctx, count)
    gate_up = ctx.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, scale=0.2)
    down = ctx.randn(EXPERTS, HIDDEN, INTERMEDIATE, scale=0.2)
    spread = torch.stack([torch.randperm(EXPERTS, generator=ctx.generator)[:TOP_K] for _ in range(x.shape[0])]).to(ctx.device)
    one_expert = torch.stack([torch.tensor([4, 0])] * x.shape[0]).to(ctx.device)  # every token: experts 4 and 0; 1, 2, 3, 5 idle
    extra = ctx.randn(large - x.shape[0], HIDDEN, scale=2.0)
    extra_ids = torch.stack([torch.randperm(EXPERTS, generator=ctx.generator)[:TOP_K] for _ in range(extra.shape[0])]).to(ctx.device)
    for label, ids in (("spread over the experts", spread), ("every token on experts 4 and 0", one_expert)):
        yield from rowwise(ctx, [x, ids], gate_up, down, sizes=sizes, label=label)
        yield from in_large_batch(ctx, [x, ids], [extra, extra_ids], gate_up, down, label=label)
    for num_experts, inter, top_k, hidden in _model_shapes(ctx):
        x = torch.cat([ctx.randn(MODEL_COUNT, hidden), hazard_rows(ctx, hidden)])
        gate_up = ctx.randn(num_experts, 2 * inter, hidden, scale=hidden**-0.5)
        down = ctx.randn(num_experts, hidden, inter, scale=inter**-0.5)

        def routes(count):
            return torch.stack([torch.randperm(num_experts, generator=ctx.generator)[:top_k] for _ in range(count)]).to(ctx.device)

        label = f"{num_experts} experts of {inter}, hidden {hidden}, top-{top_k}"
        ids = routes(x.shape[0])
        yield from rowwise(ctx, [x, ids], gate_up, down, sizes=MODEL_SIZES, label=label)
        extra = ctx.randn(MODEL_LARGE - x.shape[0], hidden)
        yield from in_large_batch(ctx, [x, ids], [extra, routes(extra.shape[0])], gate_up, down, label=label)


def combine(ctx, *, count: int = 194, sizes=SIZES):
    rows = count + 6
    dtype = torch_dtype(ctx.constants.get("input_dtype", "float32"))
    routed = ctx.randn(rows, TOP_K + 1, HIDDEN, dtype=dtype)
    routed[:6] = hazard_rows(ctx, HIDDEN).to(dtype)[:, None, :]
    weights = ctx.randn(rows, TOP_K + 1, dtype=torch.float32).abs()
    ids = torch.stack([torch.randperm(EXPERTS, generator=ctx.generator)[: TOP_K + 1] for _ in range(rows)]).to(ctx.device)
    yield from rowwise(ctx, [routed, weights, ids], sizes=sizes)
    shared, gate = ctx.randn(rows, HIDDEN, dtype=dtype), ctx.randn(rows, 1, scale=3.0, dtype=dtype)
    yield from rowwise(ctx, [routed, weights, ids, shared], sizes=sizes, label="with a shared expert")
    yield from rowwise(ctx, [routed, weights, ids, shared, gate], sizes=sizes, label="with a sigmoid-gated shared expert")
