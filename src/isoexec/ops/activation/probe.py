"""Admission trials for `activation`: elementwise, so any element must not care about its neighbours."""

import torch

from ...validate.battery import hazard_rows, rowwise

WIDTH = 40


def probe(ctx):
    gate = torch.cat([ctx.randn(40, WIDTH, scale=4.0), hazard_rows(ctx, WIDTH)])
    up = torch.cat([ctx.randn(40, WIDTH), hazard_rows(ctx, WIDTH).flip(0)])
    yield from rowwise(ctx, [gate, up])
