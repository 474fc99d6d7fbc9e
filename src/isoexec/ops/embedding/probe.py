"""Admission trials for `embedding`: a gather must copy bits whatever the batch."""

import torch

from ...validate.battery import hazard_rows, rowwise

VOCAB, HIDDEN = 50, 32


def probe(ctx):
    weight = torch.cat([ctx.randn(VOCAB - 6, HIDDEN), hazard_rows(ctx, HIDDEN)])
    ids = torch.cat([ctx.randint(VOCAB, 40), torch.arange(VOCAB - 6, VOCAB, device=ctx.device)])
    yield from rowwise(ctx, [ids], weight)
