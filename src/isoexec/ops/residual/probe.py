"""Admission trials for `residual`."""

import torch

from ...validate.battery import hazard_rows, rowwise

WIDTH = 40


def probe(ctx):
    x = torch.cat([ctx.randn(40, WIDTH), hazard_rows(ctx, WIDTH)])
    residual = torch.cat([ctx.randn(40, WIDTH), hazard_rows(ctx, WIDTH).neg()])
    yield from rowwise(ctx, [x, residual])
