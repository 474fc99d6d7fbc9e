"""Batch-invariant sampling: Gumbel-max over the contract's log-probabilities with counter-based noise.

The token drawn for row r is a function of row r alone: its log-probabilities, temperature, top-k,
top-p, request seed and the absolute position of the token being drawn. Per row, in the compute dtype:

1. greedy (temperature ≤ 0): the lowest index attaining the row maximum, and nothing else;
2. scaled = logprobs / temperature;
3. top-k (top_k > 0): rank the vocabulary by a stable descending sort (equal values keep ascending
   token order, so ties go to the lower index) and keep ranks < top_k;
4. renormalise the kept tokens with the contract's log-softmax (`log_softmax_rows`, vocab blocks of
   `VOCAB_BLOCK`, `TREE` inside and across blocks);
5. top-p (top_p < 1): walk the probabilities exp(renormalised) in the same descending order, take the
   inclusive prefix sum by Hillis–Steele doubling (round d adds the element d places to the left,
   d = 1, 2, 4, …), and keep a token when the tokens ranked before it sum to < top_p — the first
   token is always kept;
6. Gumbel-max: 64 noise bits per (seed, position, token id) from SplitMix64; u = (2k + 1) · 2^-(b+1)
   with k the top b bits and b the compute dtype's stored mantissa bits, so u is exact and strictly
   inside (0, 1); g = -log(-log(u)); token = lowest index attaining max(filtered + g).

Sorting, gathers and the integer hash are exact; every floating-point step is an elementwise IEEE
operation or a fixed-order reduction, so no step can see the batch. Degenerate rows stay row-local:
an all -inf row draws token 0, and a row holding a NaN draws a token that depends on that row alone
(greedy: the first NaN's index).
"""

import math

import torch
from torch import Tensor

from ..common import TILE_ELEMENTS, expect_dtype, torch_dtype
from ..logprobs.reference import log_softmax_rows
from ..reduce import blocked_max

# The renormalisation's reduction order; fixed by this impl's version (its source is fingerprinted)
# because the contract pins the sampler's noise and method, not its blocking.
VOCAB_BLOCK = 256
TREE = "balanced_binary"

NOISES = ("splitmix64",)
METHODS = ("gumbel_max",)

# SplitMix64's constants as int64 bit patterns (torch has no uint64 arithmetic).
_MASK64 = (1 << 64) - 1


def _int64(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


GOLDEN_GAMMA = _int64(0x9E3779B97F4A7C15)
MIX_1 = _int64(0xBF58476D1CE4E5B9)
MIX_2 = _int64(0x94D049BB133111EB)


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 bit patterns: torch's `>>` is arithmetic, so mask off the sign copies."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64(z: Tensor) -> Tensor:
    """SplitMix64's output function on int64 bit patterns (multiplies wrap modulo 2^64)."""
    z = (z ^ _shift_right(z, 30)) * MIX_1
    z = (z ^ _shift_right(z, 27)) * MIX_2
    return z ^ _shift_right(z, 31)


def splitmix64(state: Tensor) -> Tensor:
    """The first output of a SplitMix64 generator seeded with `state`."""
    return mix64(state + GOLDEN_GAMMA)


def noise_bits(seed: Tensor, position: Tensor, vocab_size: int) -> Tensor:
    """64 noise bits per token: seed [R], position [R] -> [R, V] int64.

    A row's stream is splitmix64(splitmix64(seed) ^ position); token v gets that generator's
    (v + 1)-th output, mix64(stream + (v + 1)·γ), so any token's bits are computed directly."""
    stream = splitmix64(splitmix64(seed) ^ position)  # [R]
    counter = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seed.device) * GOLDEN_GAMMA  # [V]
    return mix64(stream.unsqueeze(-1) + counter)


def uniform(bits: Tensor, dtype: torch.dtype) -> Tensor:
    """Exact u in (0, 1) from the top bits: [..] int64 -> [..] `dtype`, u = (2k + 1) · 2^-(b+1)."""
    mantissa_bits = round(-math.log2(torch.finfo(dtype).eps))
    k = _shift_right(bits, 64 - mantissa_bits)
    # 2k + 1 < 2^(b+1) is exact in `dtype`, and scaling by a power of two is exact.
    return (2 * k + 1).to(dtype) * 2.0 ** -(mantissa_bits + 1)


def gumbel_noise(seed: Tensor, position: Tensor, vocab_size: int, dtype: torch.dtype) -> Tensor:
    """Standard Gumbel noise g = -log(-log(u)): seed [R], position [R] -> [R, V]."""
    return -torch.log(-torch.log(uniform(noise_bits(seed, position, vocab_size), dtype)))


def first_argmax(x: Tensor) -> Tensor:
    """The lowest index attaining the maximum of the last dim (a NaN counts as the maximum): [R, V] -> [R]."""
    best = blocked_max(x, VOCAB_BLOCK, TREE, TREE).unsqueeze(-1)  # [R, 1]
    is_best = (x == best) | x.isnan()  # [R, V]; the max is NaN only when the row holds one
    index = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(is_best, index, x.shape[-1]).amin(-1)


def inclusive_prefix_sum(x: Tensor) -> Tensor:
    """Σ x[..., :i+1] for every i by Hillis–Steele doubling: ⌈log2 n⌉ rounds of elementwise adds."""
    step = 1
    while step < x.shape[-1]:
        x = torch.cat([x[..., :step], x[..., step:] + x[..., :-step]], dim=-1)
        step *= 2
    return x


def _rank(order: Tensor) -> Tensor:
    """Inverse permutation: order[r, j] = token at rank j -> rank[r, v] = rank of token v."""
    ranks = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, ranks)


def _top_p_keep(sorted_probs: Tensor, top_p: Tensor) -> Tensor:
    """Which ranks survive top-p: sorted_probs [R, V] non-increasing, top_p [R] -> [R, V] bool."""
    inclusive = inclusive_prefix_sum(sorted_probs)  # [R, V]
    before = torch.cat([torch.zeros_like(inclusive[..., :1]), inclusive[..., :-1]], dim=-1)  # [R, V] mass ranked earlier
    is_first = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device) == 0  # [V]
    is_off = (top_p >= 1).unsqueeze(-1)  # [R, 1]
    return (before < top_p.unsqueeze(-1)) | is_first | is_off


def _sample_rows(x: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor) -> Tensor:
    vocab_size = x.shape[-1]
    is_greedy = temperature <= 0  # [R]
    scaled = x / torch.where(is_greedy, 1.0, temperature).unsqueeze(-1)  # [R, V]

    order = torch.sort(scaled, dim=-1, descending=True, stable=True).indices  # [R, V] token at each rank
    rank = _rank(order)  # [R, V]
    k = torch.where(top_k > 0, top_k, vocab_size).unsqueeze(-1)  # [R, 1]
    kept = torch.where(rank < k, scaled, float("-inf"))
    renormalised = log_softmax_rows(kept, vocab_block=VOCAB_BLOCK, block_tree=TREE, leaf_tree=TREE)  # [R, V]

    # exp is monotone, so the probabilities in `order` are non-increasing.
    keep_sorted = _top_p_keep(torch.exp(renormalised.gather(-1, order)), top_p)  # [R, V]
    filtered = torch.where(keep_sorted.gather(-1, rank), renormalised, float("-inf"))

    drawn = first_argmax(filtered + gumbel_noise(seed, position, vocab_size, x.dtype))  # [R]
    return torch.where(is_greedy, first_argmax(x), drawn)


def check_constants(constants: dict) -> None:
    if constants.get("noise") not in NOISES:
        raise ValueError(f"sampling noise {constants.get('noise')!r} is not implemented (known: {', '.join(NOISES)})")
    if constants.get("method") not in METHODS:
        raise ValueError(f"sampling method {constants.get('method')!r} is not implemented (known: {', '.join(METHODS)})")
    if not torch_dtype(constants["compute_dtype"]).is_floating_point:
        raise ValueError(f"sampling compute_dtype must be a floating dtype, got {constants['compute_dtype']}")


def sample(logprobs: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor, *,
           input_dtype: str, compute_dtype: str, noise: str, method: str) -> Tensor:
    """One token per row: logprobs [R, V]; temperature, top_p [R] float; top_k, seed, position [R] int64 -> [R] int64."""
    expect_dtype(logprobs, input_dtype, "sampling input")
    check_constants({"noise": noise, "method": method, "compute_dtype": compute_dtype})
    dtype = torch_dtype(compute_dtype)
    rows, vocab_size = logprobs.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logprobs.device)
    # Tiling over rows only: a row's arithmetic never sees its neighbours.
    tile = max(1, TILE_ELEMENTS // max(1, vocab_size))
    for r0 in range(0, rows, tile):
        r1 = r0 + tile
        tokens[r0:r1] = _sample_rows(
            logprobs[r0:r1].to(dtype), temperature[r0:r1].to(dtype), top_k[r0:r1].long(), top_p[r0:r1].to(dtype),
            seed[r0:r1].long(), position[r0:r1].long(),
        )
    return tokens
