"""Admission trials for the MoE regions: a token's routing, its expert outputs and their sum must be
the token's alone, whatever shares the batch. Hazards: exact ties in router scores (duplicate gate
rows), every token choosing one expert, experts no token chose, single tokens and large batches."""

import dataclasses

import torch

from ...validate.battery import hazard_rows, rowwise
from ..common import torch_dtype

HIDDEN, EXPERTS, TOP_K, INTERMEDIATE = 40, 6, 2, 24
SIZES = (1, 2, 3, 7, 16, 33, 64, 200)


def _packed(op):
    """(weights [T, k], ids [T, k]) as one [T, 2k] float32 tensor (ids are small ints, exact in fp32)."""

    def call(*args, **kwargs):
        weights, ids = op(*args, **kwargs)
        return torch.cat([weights, ids.to(weights.dtype)], dim=-1)

    return call


def _tokens(ctx, count: int):
    return torch.cat([ctx.randn(count, HIDDEN, scale=2.0), hazard_rows(ctx, HIDDEN)])


def router(ctx):
    x = _tokens(ctx, 194)
    gate = ctx.randn(EXPERTS * 2, HIDDEN, scale=0.3)
    gate[3] = gate[1]  # experts 1 and 3 score exactly alike: a tie at every token
    packed = dataclasses.replace(ctx, ops={case: _packed(op) for case, op in ctx.ops.items()})
    for label, args in (("softmax top-2", (None, TOP_K, "softmax", True)),
                        ("softmax top-1, unnormalised", (None, 1, "softmax", False)),
                        ("sigmoid, bias, 4 groups keep 2, top-3, scaled", (ctx.randn(EXPERTS * 2, scale=0.1, dtype=torch.float32), 3,
                                                                          "sigmoid", True, 4, 2, 2.5))):
        yield from rowwise(packed, [x], gate, *args, sizes=SIZES, label=label)


def experts(ctx):
    x = _tokens(ctx, 194)
    gate_up = ctx.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, scale=0.2)
    down = ctx.randn(EXPERTS, HIDDEN, INTERMEDIATE, scale=0.2)
    spread = torch.stack([torch.randperm(EXPERTS, generator=ctx.generator)[:TOP_K] for _ in range(x.shape[0])]).to(ctx.device)
    one_expert = torch.stack([torch.tensor([4, 0])] * x.shape[0]).to(ctx.device)  # every token: experts 4 and 0; 1, 2, 3, 5 idle
    for label, ids in (("spread over the experts", spread), ("every token on experts 4 and 0", one_expert)):
        yield from rowwise(ctx, [x, ids], gate_up, down, sizes=SIZES, label=label)


def combine(ctx):
    rows = 200
    dtype = torch_dtype(ctx.constants.get("input_dtype", "float32"))
    routed = ctx.randn(rows, TOP_K + 1, HIDDEN, dtype=dtype)
    routed[:6] = hazard_rows(ctx, HIDDEN).to(dtype)[:, None, :]
    weights = ctx.randn(rows, TOP_K + 1, dtype=torch.float32).abs()
    ids = torch.stack([torch.randperm(EXPERTS, generator=ctx.generator)[: TOP_K + 1] for _ in range(rows)]).to(ctx.device)
    yield from rowwise(ctx, [routed, weights, ids], sizes=SIZES)
