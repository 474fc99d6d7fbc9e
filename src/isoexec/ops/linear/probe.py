"""Admission trials for `linear` and `linear.row_parallel`: rows alone vs in batches, with hazards.

The rows run at K = 64, where 8 leaves are 8 columns each, and again at UNEVEN_K, which 8 leaves do not
divide: its leaves (`reference.leaf_bounds`) are 16 and 17 columns wide, so under a 16-wide K block
some leaves take one block and their neighbours two, and a kernel that cuts leaves by another rule
where G does not divide K, or only in some batches, shows it.

For a contract fitted to a model (`ctx.geometry`), the rows are probed again at each K of the model's
projections. How many K blocks a tile's loop (or a row-parallel leaf) takes follows K and the tile's
block_k, and the compiler treats a one-block loop differently (`tile_triton`). At the probe's own K = 64
each of 8 leaves is one block under every listed tile, so a decode tile and a training tile that differ
there by block count can only disagree at a model's K.
"""

import torch

from ...validate.battery import hazard_rows, rowwise

K, N = 64, 24  # K divisible into 8 leaves and into 16-wide K blocks
UNEVEN_K = 132  # 8 leaves of 16 or 17 columns


def probe(ctx):
    x = torch.cat([ctx.randn(40, K), hazard_rows(ctx, K)])
    weight = ctx.randn(N, K, scale=K**-0.5)
    bias = ctx.randn(N)
    yield from rowwise(ctx, [x], weight, bias)
    yield from rowwise(ctx, [x], weight, None, sizes=(1, 7, 33), label="without bias")
    for k in (UNEVEN_K, *ctx.geometry.get("linear_k", ())):
        x = torch.cat([ctx.randn(24, k), hazard_rows(ctx, k)])
        yield from rowwise(ctx, [x], ctx.randn(N, k, scale=k**-0.5), ctx.randn(N), sizes=(1, 7, 16), label=f"K = {k}")
