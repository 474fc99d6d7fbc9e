"""Admission trials for `rms_norm`, plain and zero-centred, with hazardous rows."""

import torch

from ...validate.battery import hazard_rows, rowwise

HIDDEN = 48  # not a multiple of 32, so the last reduction block is padded


def probe(ctx):
    x = torch.cat([ctx.randn(40, HIDDEN), hazard_rows(ctx, HIDDEN)])
    weight = ctx.randn(HIDDEN)
    yield from rowwise(ctx, [x], weight, 1e-6)
    yield from rowwise(ctx, [x], weight, 1e-5, True, sizes=(1, 7, 33), label="zero-centred")
