"""Admission trials for `rope`: a token's rotation depends on its absolute position only."""

import torch

from ...validate.battery import hazard_rows, rowwise
from .scaling import Yarn

HEADS, HEAD_DIM, MAX_POSITIONS = 2, 16, 2048

# Its ramp spans dims 0..4 of HEAD_DIM's 8 frequencies at theta 10000, and its attention factor is not 1.
YARN = Yarn(factor=4.0, original_max_position_embeddings=512)


def probe(ctx):
    hazards = hazard_rows(ctx, HEADS * HEAD_DIM).reshape(-1, HEADS, HEAD_DIM)
    x = torch.cat([ctx.randn(40, HEADS, HEAD_DIM), hazards])
    positions = torch.cat([ctx.randint(MAX_POSITIONS, 40 + len(hazards) - 3), torch.tensor([0, 1, MAX_POSITIONS - 1], device=ctx.device)])
    yield from rowwise(ctx, [x, positions], 1_000_000.0, MAX_POSITIONS)
    yield from rowwise(ctx, [x, positions], 10_000.0, MAX_POSITIONS, HEAD_DIM // 2, sizes=(1, 7, 33), label="partial rotary")
    yield from rowwise(ctx, [x, positions], 10_000.0, MAX_POSITIONS, HEAD_DIM, YARN, sizes=(1, 7, 33), label="yarn")
