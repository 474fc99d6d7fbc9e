"""Admission trials for `rms_norm`, `rms_norm.residual` and `rms_norm.gated`, plain and zero-centred, with
hazardous rows."""

import dataclasses

import torch

from ...validate.battery import hazard_rows, rowwise

HIDDEN = 48  # not a multiple of 32, so the last reduction block is padded


def probe(ctx):
    x = torch.cat([ctx.randn(40, HIDDEN), hazard_rows(ctx, HIDDEN)])
    weight = ctx.randn(HIDDEN)
    yield from rowwise(ctx, [x], weight, 1e-6)
    yield from rowwise(ctx, [x], weight, 1e-5, True, sizes=(1, 7, 33), label="zero-centred")


def _both_outputs(op):
    """The fused op with its two outputs (y, s) side by side in one row, for `rowwise` to compare."""
    return lambda *args: torch.cat(op(*args), -1)


# Fewer rows and batch sizes than `rms_norm`'s probe, which already walks every batch size through the
# same kernel: the battery runs this probe under Triton's interpreter in CI.
RESIDUAL_RANDOM_ROWS, RESIDUAL_SIZES = 12, (1, 3, 16)


def probe_residual(ctx):
    """Both outputs of the fused op; hazard rows meet their negations and each other, and the first
    layer's form (no residual yet) is tried too."""
    ctx = dataclasses.replace(ctx, ops={case: _both_outputs(op) for case, op in ctx.ops.items()})
    hazards = hazard_rows(ctx, HIDDEN)
    x = torch.cat([ctx.randn(RESIDUAL_RANDOM_ROWS, HIDDEN), hazards, hazards])
    residual = torch.cat([ctx.randn(RESIDUAL_RANDOM_ROWS, HIDDEN), hazards.neg(), hazards.flip(0)])
    weight = ctx.randn(HIDDEN)
    yield from rowwise(ctx, [x, residual], weight, 1e-6, sizes=RESIDUAL_SIZES)
    yield from rowwise(ctx, [x, residual], weight, 1e-5, True, sizes=(5,), label="zero-centred")
    yield from rowwise(ctx, [x], None, weight, 1e-6, sizes=(5,), label="no residual")


def probe_gated(ctx):
    """Hazard rows in x and in the gate (a huge negative gate underflows exp, a huge positive one overflows it)."""
    hazards = hazard_rows(ctx, HIDDEN)
    x = torch.cat([ctx.randn(RESIDUAL_RANDOM_ROWS, HIDDEN), hazards, ctx.randn(len(hazards), HIDDEN)])
    gate = torch.cat([ctx.randn(RESIDUAL_RANDOM_ROWS, HIDDEN), ctx.randn(len(hazards), HIDDEN), hazards])
    yield from rowwise(ctx, [x, gate], ctx.randn(HIDDEN), 1e-6, sizes=RESIDUAL_SIZES)
