"""Admission trials for `sampling`: each row's drawn token alone vs in batches of other rows.

Rows mix greedy and sampled requests, temperatures, top-k and top-p settings, seeds across the whole
int64 range, positions, exact ties, masked vocabulary and duplicated requests, and knife-edge rows:
sampled rows whose leading tokens tie within a few ulps once their own Gumbel noise is added, so that
a rounding change an impl makes only inside a batch flips their token (on ordinary rows it seldom
shows at all).
"""

import torch

from ...validate.battery import Trial, rowwise
from ..common import torch_dtype
from .reference import gumbel_noise

NUM_ROWS = 72  # above the battery's largest batch size (64)
TEMPERATURES = (0.0, 0.5, 0.7, 1.0, 1.0, 1.3, 2.0)
TOP_KS = (0, 0, 1, 2, 5, 50, 100_000)
TOP_PS = (1.0, 1.0, 0.95, 0.8, 0.5, 0.1, 0.0)


def _cycle(values, rows: int, offset: int = 0) -> torch.Tensor:
    return torch.tensor([values[(i + offset) % len(values)] for i in range(rows)])


def _logprobs(ctx, rows: int, width: int) -> torch.Tensor:
    """Log-probability rows [rows, width] float32: random peaks, flat rows, two-way ties, masked vocabulary."""
    scale = torch.linspace(0.3, 6.0, rows).unsqueeze(-1)
    logits = torch.randn(rows, width, generator=ctx.generator) * scale  # [R, V]
    logits[0] = 0.0  # a flat row: every token ties
    logits[1, 5] = logits[1, 9] = logits[1].max() + 1  # two-way tie for the maximum
    logits[2, :3] = logits[2].max() + 0.5  # three-way tie at the top, across the top-k boundary
    logits[3, width // 3 :] = float("-inf")
    logits[4, torch.rand(width, generator=ctx.generator) < 0.9] = float("-inf")
    return torch.log_softmax(logits.double(), -1).float()


def _requests(ctx, rows: int) -> list[torch.Tensor]:
    temperature = _cycle(TEMPERATURES, rows).float()
    top_k = _cycle(TOP_KS, rows, offset=3).long()
    top_p = _cycle(TOP_PS, rows, offset=5).float()
    seed = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=ctx.generator)
    position = torch.randint(0, 1 << 20, (rows,), generator=ctx.generator)
    # Duplicated requests (same values in several batch slots) and neighbouring positions of one request.
    seed[10:14], position[10:14] = seed[9], position[9]
    seed[20:24], position[20:24] = seed[19], position[19] + torch.arange(1, 5)
    temperature[:3] = torch.tensor([0.0, 0.0, 1.0])
    top_k[2] = 2
    return [temperature, top_k, top_p, seed, position]


def _knife_edges(logprobs: torch.Tensor, requests: list[torch.Tensor], count: int = 8, candidates: int = 6) -> None:
    """Turn up to `count` sampled, unfiltered rows into near-ties in place: their first `candidates`
    tokens reach logp / t + g = -1 given the splitmix64 Gumbel noise g of their (seed, position), the
    rest of the row -40."""
    temperature, top_k, top_p, seed, position = requests
    width = logprobs.shape[-1]
    plain = (temperature > 0) & ((top_k == 0) | (top_k >= width)) & (top_p >= 1)
    rows = plain.nonzero().flatten()[:count]
    g = gumbel_noise(seed[rows], position[rows], width, torch.float32)[:, :candidates]  # [r, c]
    logprobs[rows] = -40.0
    logprobs[rows, :candidates] = temperature[rows, None] * (-1.0 - g)


def shuffled(ctx, batched: list[torch.Tensor]):
    """Trials for the whole set of rows in a random order, once per case."""
    rows = batched[0].shape[0]
    alone = torch.cat([ctx.call(ctx.anchor, *[b[i : i + 1] for b in batched]) for i in range(rows)])
    for case in ctx.cases:
        order = torch.randperm(rows, generator=ctx.generator)
        out = ctx.call(case, *[b[order] for b in batched])
        yield Trial(f"{case}, a shuffled batch of {rows} vs alone", alone[order], out)


def probe(ctx):
    dtype = torch_dtype(ctx.constants["input_dtype"])
    for width in (257, 1000):
        logprobs, requests = _logprobs(ctx, NUM_ROWS, width), _requests(ctx, NUM_ROWS)
        _knife_edges(logprobs, requests)
        batched = [logprobs.to(dtype).to(ctx.device), *(t.to(ctx.device) for t in requests)]
        yield from rowwise(ctx, batched, label=f"V = {width}")
        yield from shuffled(ctx, batched)
