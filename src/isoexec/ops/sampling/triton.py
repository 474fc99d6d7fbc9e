"""Batch-invariant sampling in Triton for the rows that do not filter, each row's vocabulary split among programs.

A row whose top-k keeps every token (top_k ≤ 0 or ≥ V) and whose top-p is off (top_p ≥ 1), or that is
greedy, is drawn in fp32 over ascending vocab chunks of the block below, the chunks of a row split into
segments of consecutive chunks, one program each (`segments`: so that one row is not one program walking
the whole vocabulary), in three launches: each segment's maximum (`segment_max_kernel`), each segment's
candidate (`sample_kernel`), each row's pick among its segments' candidates (`pick_kernel`):

1. greedy (temperature ≤ 0): the lowest index attaining the maximum of the row, a NaN counting as the
   maximum (the first NaN's index), as `reference.first_argmax`;
2. otherwise pass 1 takes the row maximum M (NaNs left out; the maximum of the segments' maxima) and
   m = M / t, which is the maximum of the scaled row because correctly rounded division by t > 0 is
   monotone; pass 2 draws the lowest index attaining the maximum of (x / t - m) - log(-log(u)), u from
   the same SplitMix64 bits of (seed, position, token id) as `reference.noise_bits` and
   `reference.uniform` (64-bit unsigned arithmetic, wrapping modulo 2^64 on the GPU and in the
   interpreter's numpy alike).

The renormalisation's other term, log Σ exp(x / t - m), is a row constant: it cannot move the argmax
in exact arithmetic, and it is left out so that no floating-point sum decides a token. What is left are
elementwise operations (tl.log is libdevice's precise logf; u near 1 needs it) and exact reductions
(a max, a first-index argmax), so neither the vocab block, the segments, the warp count nor the layout
the compiler specialises for (strides, alignment) can change a row's bits: they are chosen here, not in
the contract. The tokens are this impl's own: they match `sampling.reference`'s wherever rounding
leaves the same winner, and the contract admits each impl by its own id.

A row that filters (0 < top_k < V or top_p < 1, not greedy) needs a sort: the kernel only flags it, and
it is drawn with the reference's torch ops (`reference._filter` and the same noise), so its token is
`sampling.reference`'s. Which path a row takes is a function of its own temperature, top-k and top-p,
so the batch never changes a row's token. The flags are read on the host once per call, after the
kernels, which is the op's only wait on the device: three launches and one readback when no row filters.
A caller that knows from the requests' parameters that no row filters says so (`may_filter=False`, as the
engine does from `SamplingParams.filters`): then nothing is read back, and the call never waits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import reduce, triton_support
from ..common import TILE_ELEMENTS, expect_dtype
from ..logprobs import reference as logprobs_reference
from ..triton_support import after_upstream, cdiv, jit, next_power_of_2, require_device, segments, tl, triton_available
from . import reference

ID = "sampling.triton"
INPUT_DTYPES = ("bfloat16", "float16", "float32")

# Hopper constants, not swept. Every value the kernel compares is elementwise or an exact max/argmax,
# so these decide the speed only, never a token.
VOCAB_BLOCK = 4096
NUM_WARPS = 8

# The per-row flags the kernel writes, OR-ed (written out as 1 and 2 in the kernel, which reads no
# Python globals); a row with either flag filters.
IS_TOP_K, IS_TOP_P = 1, 2


# SplitMix64's constants (γ, MIX_1, MIX_2 of `reference`) are written out in the helpers below: a Triton
# kernel reads a global only as a `tl.constexpr` instance, and these modules import without Triton.
# Triton types an integer literal in [2^63, 2^64) as uint64, so the products wrap modulo 2^64.


@jit
def _mix64_multiplies(z):
    """SplitMix64's mix64 on uint64 without its last xorshift, which leaves the top 31 bits as they are."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    return (z ^ (z >> 27)) * 0x94D049BB133111EB


@jit
def _stream(p_seed, p_position):
    """A row's generator state splitmix64(splitmix64(seed) ^ position), from int64 pointers: uint64.

    splitmix64(s) is mix64(s + γ), γ = 0x9E3779B97F4A7C15."""
    b_seed = tl.load(p_seed).to(tl.uint64, bitcast=True)
    b_position = tl.load(p_position).to(tl.uint64, bitcast=True)
    b_state = _mix64_multiplies(b_seed + 0x9E3779B97F4A7C15)
    b_state = _mix64_multiplies(((b_state ^ (b_state >> 31)) ^ b_position) + 0x9E3779B97F4A7C15)
    return b_state ^ (b_state >> 31)


@jit
def _token_state(b_stream, o_v):
    """Token v's bits before mix64's last xorshift, mix64 without it of stream + (v + 1)·γ: [BLOCK] uint64."""
    return _mix64_multiplies(b_stream + (o_v + 1).to(tl.uint64) * 0x9E3779B97F4A7C15)


@jit
def _log_neg_log_uniform(b_state):
    """log(-log(u)) for u = `reference.uniform(bits, float32)`: b_state [BLOCK] uint64 -> [BLOCK] fp32.

    fp32 stores 23 mantissa bits, so u = (2k + 1) · 2^-24 with k the top 23 bits: the top 24 bits with
    the lowest set, below 2^24 and so exact in fp32, as is the power-of-two scale. u is strictly inside
    (0, 1), so -log(u) > 0 and the result is finite."""
    b_odd = ((b_state >> 40) | 1).to(tl.int32)
    b_u = b_odd.to(tl.float32) * 5.9604644775390625e-08
    return tl.log(-tl.log(b_u))


@jit
def _argmax_step(b_z, o_v, m_v, b_best, i_best, i_nan, V: tl.constexpr):
    """Fold one vocab chunk into a running (max, its lowest index, lowest NaN index; V for none).

    Every step is a comparison, so the answer is the same for any chunking: -0.0 and +0.0 compare
    equal and go to the lower index, as in torch.argmax."""
    is_nan = m_v & (b_z != b_z)
    i_nan = tl.minimum(i_nan, tl.min(tl.where(is_nan, o_v, V), axis=0))
    b_z = tl.where(m_v & (b_z == b_z), b_z, float("-inf"))
    b_max = tl.max(b_z, axis=0)
    i_max = tl.min(tl.where(m_v & (b_z == b_max), o_v, V), axis=0)
    # Equal maxima keep the earlier chunk's, lower, index.
    is_better = b_max > b_best
    return tl.where(is_better, b_max, b_best), tl.where(is_better, i_max, i_best), i_nan


@jit(do_not_specialize=["NS", "PER_SEGMENT"], dependent=True)
def segment_max_kernel(x, seg_max, NS, PER_SEGMENT, stride_xr, stride_xv, V: tl.constexpr, VOCAB_BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program (r, s): the maximum of row r's chunks [s PER_SEGMENT, (s + 1) PER_SEGMENT), NaNs left out."""
    after_upstream(PDL)
    i_r, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1)
    p_x = x + i_r * stride_xr
    b_max = tl.full([], float("-inf"), dtype=tl.float32)
    # `while`, not `for`: the interpreter takes no runtime `range` bound. Chunks past the row (a last,
    # short segment) are masked whole.
    i_v = i_s * PER_SEGMENT
    while i_v < (i_s + 1) * PER_SEGMENT:
        o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
        m_v = o_v < V
        b_x = tl.load(p_x + o_v * stride_xv, mask=m_v, other=0.0).to(tl.float32)
        b_max = tl.maximum(b_max, tl.max(tl.where(m_v & (b_x == b_x), b_x, float("-inf")), axis=0))
        i_v += 1
    tl.store(seg_max + i_r * NS + i_s, b_max)


@jit(do_not_specialize=["NS", "PER_SEGMENT"], dependent=True)
def sample_kernel(
    x, temperature, top_k, top_p, seed, position, flags, seg_max, seg_best, seg_index, seg_nan,
    NS, PER_SEGMENT,
    stride_xr, stride_xv, stride_t, stride_k, stride_p, stride_s, stride_q,
    V: tl.constexpr,
    NS_PAD: tl.constexpr,
    VOCAB_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Program (r, s): row r's best candidate among its chunks [s PER_SEGMENT, (s + 1) PER_SEGMENT), as
    (value, lowest index attaining it, lowest NaN index) into seg_best / seg_index / seg_nan [R, NS]."""
    after_upstream(PDL)
    i_r, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1)
    p_x = x + i_r * stride_xr
    b_t = tl.load(temperature + i_r * stride_t).to(tl.float32)
    b_k = tl.load(top_k + i_r * stride_k)
    b_p = tl.load(top_p + i_r * stride_p).to(tl.float32)
    # As `reference._sample_rows` reads them; a NaN temperature samples, a NaN top_p filters.
    is_greedy = b_t <= 0
    is_top_k = (b_k > 0) & (b_k < V) & ~is_greedy
    is_top_p = ((b_p < 1) | (b_p != b_p)) & ~is_greedy
    is_filtering = is_top_k | is_top_p
    if i_s == 0:
        tl.store(flags + i_r, is_top_k.to(tl.int8) + is_top_p.to(tl.int8) * 2)

    b_best = tl.full([], float("-inf"), dtype=tl.float32)
    i_best = tl.full([], 0, dtype=tl.int32)
    i_nan = tl.full([], V, dtype=tl.int32)
    first, end = i_s * PER_SEGMENT, (i_s + 1) * PER_SEGMENT  # as in segment_max_kernel
    i_v = first
    if is_greedy:
        while i_v < end:
            o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
            m_v = o_v < V
            b_x = tl.load(p_x + o_v * stride_xv, mask=m_v, other=0.0).to(tl.float32)  # [VOCAB_BLOCK]
            b_best, i_best, i_nan = _argmax_step(b_x, o_v, m_v, b_best, i_best, i_nan, V)
            i_v += 1
    elif not is_filtering:
        o_s = tl.arange(0, NS_PAD)
        b_max = tl.max(tl.load(seg_max + i_r * NS + o_s, mask=o_s < NS, other=float("-inf")), axis=0)
        # An all -inf row keeps its -inf (and draws token 0); + 0.0 makes a -0.0 maximum +0.0.
        b_m = tl.math.div_rn(tl.where(b_max == float("-inf"), 0.0, b_max), b_t) + 0.0

        b_stream = _stream(seed + i_r * stride_s, position + i_r * stride_q)
        while i_v < end:
            o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
            m_v = o_v < V
            b_x = tl.load(p_x + o_v * stride_xv, mask=m_v, other=0.0).to(tl.float32)
            b_z = (tl.math.div_rn(b_x, b_t) - b_m) - _log_neg_log_uniform(_token_state(b_stream, o_v))
            b_best, i_best, i_nan = _argmax_step(b_z, o_v, m_v, b_best, i_best, i_nan, V)
            i_v += 1
    tl.store(seg_best + i_r * NS + i_s, b_best)
    tl.store(seg_index + i_r * NS + i_s, i_best)
    tl.store(seg_nan + i_r * NS + i_s, i_nan)


@jit(do_not_specialize=["NS"], dependent=True)
def pick_kernel(flags, seg_best, seg_index, seg_nan, tokens, NS, V: tl.constexpr, NS_PAD: tl.constexpr, PDL: tl.constexpr = False):
    """Row r's token from its segments' candidates, folded as `_argmax_step` folds chunks: the largest value
    at the lowest index (segments cover ascending vocab ranges), unless some token is NaN."""
    after_upstream(PDL)
    i_r = tl.program_id(0).to(tl.int64)
    o_s = tl.arange(0, NS_PAD)
    m_s = o_s < NS
    b_best = tl.load(seg_best + i_r * NS + o_s, mask=m_s, other=float("-inf"))
    i_seg = tl.load(seg_index + i_r * NS + o_s, mask=m_s, other=V)
    b_max = tl.max(b_best, axis=0)
    # A segment's -inf candidate carries index 0 (its fold's start); an all -inf row draws token 0.
    i_best = tl.where(b_max == float("-inf"), 0, tl.min(tl.where(m_s & (b_best == b_max), i_seg, V), axis=0))
    i_nan = tl.min(tl.load(seg_nan + i_r * NS + o_s, mask=m_s, other=V), axis=0)
    i_token = tl.where(i_nan < V, i_nan, i_best)
    # A filtering row's token stays -1 until the host draws it.
    tl.store(tokens + i_r, tl.where(tl.load(flags + i_r) != 0, -1, i_token).to(tl.int64))


@jit
def noise_bits_kernel(seed, position, bits, stride_s, stride_q, V: tl.constexpr, NV: tl.constexpr, VOCAB_BLOCK: tl.constexpr):
    i_r = tl.program_id(0).to(tl.int64)
    b_stream = _stream(seed + i_r * stride_s, position + i_r * stride_q)
    for i_v in range(0, NV):
        o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
        b_state = _token_state(b_stream, o_v)
        b_bits = b_state ^ (b_state >> 31)
        tl.store(bits + i_r * V + o_v, b_bits.to(tl.int64, bitcast=True), mask=o_v < V)


def noise_bits(seed: Tensor, position: Tensor, vocab_size: int) -> Tensor:
    """The bits `sample_kernel` draws from: seed [R], position [R] int64 -> [R, V] int64, as `reference.noise_bits`."""
    require_device(ID, seed, position)
    rows = seed.shape[0]
    bits = torch.empty((rows, vocab_size), dtype=torch.int64, device=seed.device)
    if rows and vocab_size:
        block = min(VOCAB_BLOCK, next_power_of_2(vocab_size))
        noise_bits_kernel[(rows,)](seed, position, bits, seed.stride(0), position.stride(0),
                                   V=vocab_size, NV=cdiv(vocab_size, block), VOCAB_BLOCK=block)
    return bits


def _draw_filtering(x: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor,
                    flags: dict[int, int], tokens: Tensor) -> None:
    """`reference._sample_rows` for the rows in `flags` (row -> IS_TOP_K | IS_TOP_P), into `tokens`.

    Tiles of rows bound the sort's memory; a step no row of a tile needs is skipped, which keeps every
    token of the rows that do not need it (see `reference._filter`)."""
    vocab_size = x.shape[1]
    rows = list(flags)
    tile = max(1, TILE_ELEMENTS // vocab_size)
    for r0 in range(0, len(rows), tile):
        chunk = rows[r0 : r0 + tile]
        index = torch.tensor(chunk, device=x.device)
        scaled = x[index].float() / temperature[index].unsqueeze(-1)  # [r, V]
        filtered = reference._filter(scaled, top_k[index], top_p[index], any_top_k=any(flags[r] & IS_TOP_K for r in chunk),
                                     any_top_p=any(flags[r] & IS_TOP_P for r in chunk))
        noise = reference._uniform_noise(seed[index], position[index], vocab_size, torch.float32)  # [r, V]
        tokens[index] = reference.first_argmax(filtered - torch.log(-torch.log(noise)))


def draw_unfiltered(x: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor, *,
                    vocab_block: int = VOCAB_BLOCK, num_warps: int = NUM_WARPS, num_segments: int | None = None) -> tuple[Tensor, Tensor]:
    """The kernels alone: -> every row's token as if it did not filter [R] int64, and each row's flags [R] int8
    (IS_TOP_K | IS_TOP_P where the row filters, 0 where its token is final). Three launches: the segments'
    maxima, their candidates, each row's pick."""
    rows, vocab_size = x.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=x.device)
    flags = torch.empty(rows, dtype=torch.int8, device=x.device)
    if rows:
        block = min(vocab_block, next_power_of_2(vocab_size))
        chunks = cdiv(vocab_size, block)
        count = num_segments or segments(rows, chunks)
        per_segment = cdiv(chunks, count)
        count = cdiv(chunks, per_segment)
        seg_max, seg_best = (torch.empty((rows, count), dtype=torch.float32, device=x.device) for _ in range(2))
        seg_index, seg_nan = (torch.empty((rows, count), dtype=torch.int32, device=x.device) for _ in range(2))
        # The split is a runtime argument and NS_PAD the row's chunks (any split's segments fit), so a
        # new number of rows (prefill samples a varying few) never compiles another kernel.
        segment_max_kernel[(rows, count)](x, seg_max, count, per_segment, x.stride(0), x.stride(1), V=vocab_size, VOCAB_BLOCK=block,
                                          num_warps=num_warps)
        sample_kernel[(rows, count)](
            x, temperature, top_k, top_p, seed, position, flags, seg_max, seg_best, seg_index, seg_nan, count, per_segment,
            x.stride(0), x.stride(1), temperature.stride(0), top_k.stride(0), top_p.stride(0), seed.stride(0), position.stride(0),
            V=vocab_size, NS_PAD=next_power_of_2(chunks), VOCAB_BLOCK=block, num_warps=num_warps,
        )
        pick_kernel[(rows,)](flags, seg_best, seg_index, seg_nan, tokens, count, V=vocab_size, NS_PAD=next_power_of_2(chunks), num_warps=1)
    return tokens, flags


def sample_rows(x: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor, *,
                vocab_block: int = VOCAB_BLOCK, num_warps: int = NUM_WARPS, may_filter: bool = True) -> Tensor:
    """x [R, V] float; temperature, top_p [R] float32; top_k, seed, position [R] int64 -> [R] int64.
    may_filter=False: the caller vouches that no row filters, so the flags are not read back."""
    tokens, flags = draw_unfiltered(x, temperature, top_k, top_p, seed, position, vocab_block=vocab_block, num_warps=num_warps)
    if not may_filter or not len(tokens):
        return tokens
    filtering = {r: flag for r, flag in enumerate(flags.tolist()) if flag}
    if filtering:
        _draw_filtering(x, temperature, top_k, top_p, seed, position, filtering, tokens)
    return tokens


def check_constants(constants: dict) -> None:
    reference.check_constants(constants)
    if constants["compute_dtype"] != "float32":
        raise ValueError(f'{ID} computes in float32 only, got compute_dtype = "{constants["compute_dtype"]}"')
    if constants["input_dtype"] not in INPUT_DTYPES:
        raise ValueError(f"{ID}: input_dtype must be one of {', '.join(INPUT_DTYPES)}, got \"{constants['input_dtype']}\"")


def sample(logprobs: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor, *,
           input_dtype: str, compute_dtype: str, noise: str, method: str, may_filter: bool = True) -> Tensor:
    """One token per row: logprobs [R, V]; temperature, top_p [R] float; top_k, seed, position [R] int64 -> [R] int64.

    Waits on the device once per call, to read which rows filter, unless `may_filter` is False (the module's
    note); it runs eagerly, outside CUDA graphs."""
    expect_dtype(logprobs, input_dtype, "sampling input")
    check_constants({"input_dtype": input_dtype, "compute_dtype": compute_dtype, "noise": noise, "method": method})
    require_device(ID, logprobs, temperature, top_k, top_p, seed, position)
    return sample_rows(logprobs, temperature.float(), top_k.long(), top_p.float(), seed.long(), position.long(), may_filter=may_filter)


def register(registry, cases: frozenset) -> None:
    """Register sampling.triton@1 for `cases`; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="sampling", cases=cases, fn=sample, check_constants=check_constants,
                               sources=(segment_max_kernel, sample_kernel, pick_kernel, triton_support, reference, reduce, logprobs_reference)))
