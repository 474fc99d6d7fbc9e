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

Sorting, gathers, argmax and the integer hash are exact; every floating-point step is an elementwise
IEEE operation or a fixed-order reduction, so no step can see the batch. Degenerate rows stay
row-local: an all -inf row draws token 0, and a row holding a NaN draws a token that depends on that
row alone (greedy: the first NaN's index).

A row whose top-k keeps every rank (top_k ≤ 0 or ≥ V) and whose top-p is off (top_p ≥ 1) keeps
every token through steps 3 and 5, so it skips them — the sort, ranks and prefix sum — and goes
straight to step 4 on `scaled`, with the same bits; so does a greedy row, whose draw is discarded.
Which rows those are is read on the host, once per call (see `sample`).
"""

import math

import torch
from torch import Tensor

from ..common import TILE_ELEMENTS, expect_dtype, torch_dtype
from ..logprobs.reference import log_softmax_rows

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


def _xorshift(z: Tensor, bits: int) -> Tensor:
    return z ^ _shift_right(z, bits)


def _mix64_multiplies(z: Tensor) -> Tensor:
    """mix64 without its last xorshift, which leaves the top 31 bits as they are."""
    return _xorshift(_xorshift(z, 30) * MIX_1, 27) * MIX_2


def mix64(z: Tensor) -> Tensor:
    """SplitMix64's output function on int64 bit patterns (multiplies wrap modulo 2^64)."""
    return _xorshift(_mix64_multiplies(z), 31)


def splitmix64(state: Tensor) -> Tensor:
    """The first output of a SplitMix64 generator seeded with `state`."""
    return mix64(state + GOLDEN_GAMMA)


def _counters(seed: Tensor, position: Tensor, vocab_size: int) -> Tensor:
    """The state mix64 turns into token v's bits, stream + (v + 1)·γ: seed [R], position [R] -> [R, V] int64."""
    stream = splitmix64(splitmix64(seed) ^ position)  # [R]
    token = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seed.device)  # [V]
    return torch.add(stream.unsqueeze(-1), token, alpha=GOLDEN_GAMMA)


def noise_bits(seed: Tensor, position: Tensor, vocab_size: int) -> Tensor:
    """64 noise bits per token: seed [R], position [R] -> [R, V] int64.

    A row's stream is splitmix64(splitmix64(seed) ^ position); token v gets that generator's
    (v + 1)-th output, mix64(stream + (v + 1)·γ), so any token's bits are computed directly."""
    return mix64(_counters(seed, position, vocab_size))


def _mantissa_bits(dtype: torch.dtype) -> int:
    return round(-math.log2(torch.finfo(dtype).eps))


def uniform(bits: Tensor, dtype: torch.dtype) -> Tensor:
    """Exact u in (0, 1) from the top bits: [..] int64 -> [..] `dtype`, u = (2k + 1) · 2^-(b+1)."""
    mantissa_bits = _mantissa_bits(dtype)
    # The top b + 1 bits are 2k plus one more bit; setting the lowest gives 2k + 1 < 2^(b+1), exact in
    # `dtype`, and scaling by a power of two is exact.
    odd = _shift_right(bits, 63 - mantissa_bits) | 1
    return odd.to(dtype) * 2.0 ** -(mantissa_bits + 1)


def _uniform_noise(seed: Tensor, position: Tensor, vocab_size: int, dtype: torch.dtype) -> Tensor:
    """uniform(noise_bits(seed, position, vocab_size), dtype): [R], [R] -> [R, V].

    `uniform` reads only the top b bits, which mix64's last xorshift leaves as they are when b ≤ 31
    (every dtype but float64), so it is skipped then."""
    state = _mix64_multiplies(_counters(seed, position, vocab_size))  # [R, V]
    if _mantissa_bits(dtype) > 31:
        state = _xorshift(state, 31)
    return uniform(state, dtype)


def gumbel_noise(seed: Tensor, position: Tensor, vocab_size: int, dtype: torch.dtype) -> Tensor:
    """Standard Gumbel noise g = -log(-log(u)): seed [R], position [R] -> [R, V]."""
    return -torch.log(-torch.log(_uniform_noise(seed, position, vocab_size, dtype)))


def first_argmax(x: Tensor) -> Tensor:
    """The lowest index attaining the maximum of the last dim (a NaN counts as the maximum): [R, V] -> [R].

    torch.argmax's comparison (`GreaterOrNan` in ATen's SharedReduceOps.h, used by the CPU and CUDA
    kernels) prefers a NaN to any number and the lower index among equals and among NaNs, so its
    answer, an integer, does not depend on the order in which the device visits the row."""
    return torch.argmax(x, dim=-1)


def _prefix_sums(x: Tensor) -> Tensor:
    """Hillis–Steele doubling over the last dim, left-padded: [..., n] -> [..., pad + n], pad ≥ 1.

    Round d (d = 1, 2, 4, … < n) adds to every element the one d places to its left, so element i ends
    as Σ x[..., :i+1]. The pad holds -0.0, the identity of IEEE addition (x + -0.0 is x, signed zeros
    included), so an element with fewer than d elements to its left comes out of round d as it went in,
    as in the unpadded doubling; two buffers take turns, one add per round."""
    n = x.shape[-1]
    pad = max(1, (1 << (n - 1).bit_length()) >> 1)  # the largest d
    sums = x.new_full((*x.shape[:-1], pad + n), -0.0)
    sums[..., pad:] = x
    spare = sums.clone()
    step = 1
    while step < n:
        torch.add(sums[..., pad:], sums[..., pad - step : pad - step + n], out=spare[..., pad:])
        sums, spare = spare, sums
        step *= 2
    return sums


def _rank(order: Tensor) -> Tensor:
    """Inverse permutation: order[r, j] = token at rank j -> rank[r, v] = rank of token v."""
    ranks = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, ranks)


def _top_p_keep(sorted_probs: Tensor, top_p: Tensor) -> Tensor:
    """Which ranks survive top-p: sorted_probs [R, V] non-increasing, top_p [R] -> [R, V] bool."""
    vocab_size = sorted_probs.shape[-1]
    sums = _prefix_sums(sorted_probs)  # [R, pad + V]
    before = sums[..., -vocab_size - 1 : -1]  # [R, V] mass ranked earlier (rank 0 reads the pad)
    keep = before < top_p.unsqueeze(-1)
    keep[..., 0] = True  # the first token is always kept
    return keep | (top_p >= 1).unsqueeze(-1)


def _renormalise(x: Tensor) -> Tensor:
    return log_softmax_rows(x, vocab_block=VOCAB_BLOCK, block_tree=TREE, leaf_tree=TREE)


def _filter(scaled: Tensor, top_k: Tensor, top_p: Tensor, *, any_top_k: bool, any_top_p: bool) -> Tensor:
    """Steps 3–5: scaled [R, V] -> filtered [R, V]. With `any_top_k` (`any_top_p`) False no row's top-k
    (top-p) drops a token, and that step is skipped."""
    vocab_size = scaled.shape[-1]
    order = torch.sort(scaled, dim=-1, descending=True, stable=True).indices  # [R, V] token at each rank
    rank = _rank(order)  # [R, V]
    kept = scaled
    if any_top_k:
        k = torch.where(top_k > 0, top_k, vocab_size).unsqueeze(-1)  # [R, 1]
        kept = torch.where(rank < k, scaled, float("-inf"))
    renormalised = _renormalise(kept)  # [R, V]
    if not any_top_p:
        return renormalised
    # exp is monotone, so the probabilities in `order` are non-increasing.
    keep_sorted = _top_p_keep(torch.exp(renormalised.gather(-1, order)), top_p)  # [R, V]
    return torch.where(keep_sorted.gather(-1, rank), renormalised, float("-inf"))


def _sample_rows(x: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor) -> Tensor:
    num_rows, vocab_size = x.shape
    # The host read `sample` documents; ~(top_p >= 1) rather than top_p < 1, as a NaN top_p keeps rank 0 only.
    is_greedy, is_top_k, is_top_p = torch.stack([temperature <= 0, (top_k > 0) & (top_k < vocab_size), ~(top_p >= 1)]).tolist()
    if all(is_greedy):
        return first_argmax(x)
    is_filtering = [not greedy and (k or p) for greedy, k, p in zip(is_greedy, is_top_k, is_top_p)]
    filtering = [r for r in range(num_rows) if is_filtering[r]]
    plain = [r for r in range(num_rows) if not is_filtering[r]]
    any_top_k, any_top_p = any(is_top_k[r] for r in filtering), any(is_top_p[r] for r in filtering)

    # Dividing by 1.0 is exact, so without greedy rows `temperature` is divided by as it is.
    scaled = x / (torch.where(temperature <= 0, 1.0, temperature) if any(is_greedy) else temperature).unsqueeze(-1)  # [R, V]
    if not filtering:
        filtered = _renormalise(scaled)
    elif not plain:
        filtered = _filter(scaled, top_k, top_p, any_top_k=any_top_k, any_top_p=any_top_p)
    else:
        filtered = torch.empty_like(scaled)
        index = torch.tensor(filtering, device=x.device)
        filtered[index] = _filter(scaled[index], top_k[index], top_p[index], any_top_k=any_top_k, any_top_p=any_top_p)
        index = torch.tensor(plain, device=x.device)
        filtered[index] = _renormalise(scaled[index])

    # filtered + g with g = -log(-log(u)) is filtered - log(-log(u)): IEEE a - b is a + (-b) exactly.
    drawn = first_argmax(filtered - torch.log(-torch.log(_uniform_noise(seed, position, vocab_size, x.dtype))))  # [R]
    return torch.where(temperature <= 0, first_argmax(x), drawn) if any(is_greedy) else drawn


def check_constants(constants: dict) -> None:
    if constants.get("noise") not in NOISES:
        raise ValueError(f"sampling noise {constants.get('noise')!r} is not implemented (known: {', '.join(NOISES)})")
    if constants.get("method") not in METHODS:
        raise ValueError(f"sampling method {constants.get('method')!r} is not implemented (known: {', '.join(METHODS)})")
    if not torch_dtype(constants["compute_dtype"]).is_floating_point:
        raise ValueError(f"sampling compute_dtype must be a floating dtype, got {constants['compute_dtype']}")


def sample(logprobs: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor, *,
           input_dtype: str, compute_dtype: str, noise: str, method: str, may_filter: bool = True) -> Tensor:
    """One token per row: logprobs [R, V]; temperature, top_p [R] float; top_k, seed, position [R] int64 -> [R] int64.

    Waits on the device once per tile of rows, to read which rows are greedy and which filter (so a caller's
    `may_filter`, `sampling.triton`'s hint, saves nothing here): this op runs eagerly, outside CUDA graphs."""
    expect_dtype(logprobs, input_dtype, "sampling input")
    check_constants({"noise": noise, "method": method, "compute_dtype": compute_dtype})
    dtype = torch_dtype(compute_dtype)
    rows, vocab_size = logprobs.shape

    def draw(r0: int, r1: int) -> Tensor:
        return _sample_rows(
            logprobs[r0:r1].to(dtype), temperature[r0:r1].to(dtype), top_k[r0:r1].long(), top_p[r0:r1].to(dtype),
            seed[r0:r1].long(), position[r0:r1].long(),
        )

    # Tiling over rows only: a row's arithmetic never sees its neighbours.
    tile = max(1, TILE_ELEMENTS // max(1, vocab_size))
    if 0 < rows <= tile:
        return draw(0, rows)
    tokens = torch.empty(rows, dtype=torch.int64, device=logprobs.device)
    for r0 in range(0, rows, tile):
        tokens[r0 : r0 + tile] = draw(r0, r0 + tile)
    return tokens
