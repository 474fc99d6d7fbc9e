"""Admission trials for `logprobs`: full-vocabulary rows alone vs in batches, with masked and hazardous rows."""

import torch

from ...validate.battery import hazard_rows, rowwise

DEFAULT_VOCAB_BLOCK = 256  # for impls (native) that pin no vocab blocking


def edge_rows(ctx, width: int) -> torch.Tensor:
    """Masked vocabulary, fully masked, a single live token, NaN, +inf and large magnitudes: [8, width]."""
    inf = float("inf")
    base = torch.randn(width, generator=ctx.generator) * 4
    index = torch.arange(width)
    rows = [
        torch.where(torch.rand(width, generator=ctx.generator) < 0.3, -inf, base),
        torch.where(index >= width // 2, -inf, base),  # whole trailing blocks masked
        torch.full((width,), -inf),
        torch.where(index == width - 1, base, -inf),
        torch.where(index == 7, float("nan"), base),
        torch.where(index == 3, inf, base),
        base * 1e4,
        torch.where(index % 5 == 0, base * 3e4, base * 1e-3),
    ]
    return torch.stack(rows).to(ctx.dtype).to(ctx.device)


def probe(ctx):
    block = ctx.constants.get("vocab_block", DEFAULT_VOCAB_BLOCK)
    # Neither width is a multiple of the block, so the last block is padded inside the reductions.
    for width in (block + 44, 4 * block - 24):
        logits = torch.cat([ctx.randn(24, width, scale=3.0), hazard_rows(ctx, width), edge_rows(ctx, width)])
        yield from rowwise(ctx, [logits], label=f"V = {width}")
