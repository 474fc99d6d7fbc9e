"""Admission trials for `linear` and `linear.row_parallel`: rows alone vs in batches, with hazards."""

import torch

from ...validate.battery import hazard_rows, rowwise

K, N = 64, 24  # K divisible into 8 leaves and into 16-wide K blocks


def probe(ctx):
    x = torch.cat([ctx.randn(40, K), hazard_rows(ctx, K)])
    weight = ctx.randn(N, K, scale=K**-0.5)
    bias = ctx.randn(N)
    yield from rowwise(ctx, [x], weight, bias)
    yield from rowwise(ctx, [x], weight, None, sizes=(1, 7, 33), label="without bias")
