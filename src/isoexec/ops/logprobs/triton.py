"""Batch-invariant full-vocabulary log-softmax in three passes over each row.

Row r, in fp32, over ascending vocab chunks of VOCAB_BLOCK: pass 1 folds each chunk's `tl.max` into a
running max m; pass 2 folds each chunk's `tl.sum` of exp(x - m) into a running sum S; pass 3 writes
(x - m) - log(S), rounded once to the output dtype. Padding lanes of the last chunk are removed with
`where` (-inf for the max, +0.0 for the sum), never by arithmetic on what they loaded. Each chunk's
in-chunk tree is fixed by VOCAB_BLOCK and num_warps, and the folds run in chunk order whichever program
computed a chunk's value, so nothing depends on how many rows share the call or how a row is split (below).
V is a compile-time constant (see `ops/linear/triton.py`).

Rows that are not ordinary probability rows behave as in the reference: -inf entries give -inf; an
all -inf row gives all -inf (its max replaced by 0 and its sum, 0, by 1); a NaN or +inf anywhere makes
that row, and only that row, NaN.

The backward pass, grad - exp(log-probs) · Σ grad, is one more Triton program per row
(`logprobs_bwd_kernel`: Σ grad over the row, then the difference, rounded once to the logits' dtype).
Gradients must be correct, not batch-invariant. The same formula in torch ops made four passes over
[T, V] fp32 tensors (exp, product, difference, cast) after the row sum, where this reads the gradient
twice and the log-probs once and writes the result once (docs/experiments.md, bb94c8d / ab91c28)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from . import tuning
from ..triton_support import after_upstream, cdiv, jit, needs_grad, require_device, segments, tl, triton_available

ID = "logprobs.triton"
INPUT_DTYPES = ("bfloat16", "float16", "float32")

# The three passes are cut where a chunk's value leaves its program: `chunk_max_kernel` writes each chunk's
# `tl.max`, `chunk_sum_kernel` folds those maxima in chunk order (pass 1) and writes each chunk's `tl.sum` of
# exp(x - m), `chunk_write_kernel` folds both (the sum from +0.0, in chunk order; pass 2) and writes pass 3. Program
# (r, s) takes segment s of row r's chunks (`triton_support.segments`: a call of few rows splits each row among
# programs, from 512 rows up one program takes a row). A tensor-parallel rank (`vocab_parallel`) holds whole
# chunks of the row and runs the same kernels, its chunks as one segment, with every rank's maxima and sums
# gathered (bytes) into the row's chunk order between them. Each chunk meets the same operations every way.


@jit
def _folded_max(p_m, NB: tl.constexpr):
    """Pass 1's running max over the gathered chunk maxima, and whether the row is empty. Unrolled: the
    loads issue together, and the fold keeps pass 1's order."""
    b_max = tl.full([], float("-inf"), dtype=tl.float32)
    for i_b in tl.static_range(NB):
        b_max = tl.maximum(b_max, tl.load(p_m + i_b))
    is_empty = b_max == float("-inf")
    return tl.where(is_empty, 0.0, b_max), is_empty


@jit
def _folded_sum(p_s, NB: tl.constexpr):
    """Pass 2's running sum over the gathered chunk sums, from +0.0 in chunk order (unrolled likewise)."""
    b_sum = tl.full([], 0.0, dtype=tl.float32)
    for i_b in tl.static_range(NB):
        b_sum += tl.load(p_s + i_b)
    return b_sum


# Program (r, s) below takes row r's chunks [s PER_SEGMENT, (s + 1) PER_SEGMENT) (`while`: the interpreter
# takes no runtime `range` bound).
@jit(do_not_specialize=["PER_SEGMENT"], dependent=True)
def chunk_max_kernel(x, mx, PER_SEGMENT, stride_xr, stride_xv, V: tl.constexpr, NV: tl.constexpr, VOCAB_BLOCK: tl.constexpr,
                     PDL: tl.constexpr = False):
    after_upstream(PDL)
    i_r, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_v = i_s * PER_SEGMENT
    while i_v < tl.minimum((i_s + 1) * PER_SEGMENT, NV):
        o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
        m_v = o_v < V
        b_x = tl.load(x + i_r * stride_xr + o_v * stride_xv, mask=m_v, other=0.0).to(tl.float32)
        tl.store(mx + i_r * NV + i_v, tl.max(tl.where(m_v, b_x, float("-inf")), axis=0))
        i_v += 1


@jit(do_not_specialize=["PER_SEGMENT"], dependent=True)
def chunk_sum_kernel(x, maxima, sums, PER_SEGMENT, stride_xr, stride_xv, V: tl.constexpr, NV: tl.constexpr, NB: tl.constexpr,
                     VOCAB_BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    after_upstream(PDL)
    i_r, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b_max, _ = _folded_max(maxima + i_r * NB, NB)
    i_v = i_s * PER_SEGMENT
    while i_v < tl.minimum((i_s + 1) * PER_SEGMENT, NV):
        o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
        m_v = o_v < V
        b_x = tl.load(x + i_r * stride_xr + o_v * stride_xv, mask=m_v, other=0.0).to(tl.float32)
        tl.store(sums + i_r * NV + i_v, tl.sum(tl.where(m_v, tl.exp(b_x - b_max), 0.0), axis=0))
        i_v += 1


@jit(do_not_specialize=["PER_SEGMENT"], dependent=True)
def chunk_write_kernel(x, maxima, sums, y, PER_SEGMENT, stride_xr, stride_xv, stride_yr, stride_yv, V: tl.constexpr, NV: tl.constexpr,
                       NB: tl.constexpr, VOCAB_BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    after_upstream(PDL)
    i_r, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b_max, is_empty = _folded_max(maxima + i_r * NB, NB)
    b_log_sum = tl.log(tl.where(is_empty, 1.0, _folded_sum(sums + i_r * NB, NB)))
    i_v = i_s * PER_SEGMENT
    while i_v < tl.minimum((i_s + 1) * PER_SEGMENT, NV):
        o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
        m_v = o_v < V
        b_x = tl.load(x + i_r * stride_xr + o_v * stride_xv, mask=m_v, other=0.0).to(tl.float32)
        b_y = (b_x - b_max) - b_log_sum
        tl.store(y + i_r * stride_yr + o_v * stride_yv, b_y.to(y.dtype.element_ty), mask=m_v)
        i_v += 1


def logprobs_fwd(logits: Tensor, out_dtype: torch.dtype, *, vocab_block: int, num_warps: int, num_segments: int | None = None) -> Tensor:
    """logits [R, V] -> [R, V] in `out_dtype`, each row's chunks split among `num_segments` programs (by default
    `segments`' rule; any number gives the same bits)."""
    rows, vocab = logits.shape
    y = logits.new_empty((rows, vocab), dtype=out_dtype)
    if rows == 0 or vocab == 0:
        return y
    chunks = cdiv(vocab, vocab_block)
    per_segment = cdiv(chunks, num_segments or segments(rows, chunks))
    grid = (rows, cdiv(chunks, per_segment))
    sizes = dict(V=vocab, NV=chunks, VOCAB_BLOCK=vocab_block, num_warps=num_warps)
    maxima, sums = (logits.new_empty((rows, chunks), dtype=torch.float32) for _ in range(2))
    chunk_max_kernel[grid](logits, maxima, per_segment, logits.stride(0), logits.stride(1), **sizes)
    chunk_sum_kernel[grid](logits, maxima, sums, per_segment, logits.stride(0), logits.stride(1), NB=chunks, **sizes)
    chunk_write_kernel[grid](logits, maxima, sums, y, per_segment, logits.stride(0), logits.stride(1), y.stride(0), y.stride(1),
                             NB=chunks, **sizes)
    return y


def vocab_parallel(logits: Tensor, gather, *, input_dtype: str, output_dtype: str, accum_dtype: str, vocab_block: int,
                   num_warps: int) -> Tensor:
    """A tensor-parallel rank's part of `logprobs` (`Impl.vocab_parallel`; no autograd, `parallel/ops.py` adds it):
    logits [R, v] of the rank's whole vocab chunks -> [R, v], the whole row's entries bit for bit. gather([R, its
    chunks]) -> [R, every chunk] in the row's order, fp32 leaves moved as bytes; every rank calls it twice."""
    expect_dtype(logits, input_dtype, "logprobs input")
    require_device(ID, logits)
    rows, vocab = logits.shape
    chunks = cdiv(vocab, vocab_block)
    sizes = dict(V=vocab, NV=chunks, VOCAB_BLOCK=vocab_block)
    launch = rows > 0 and chunks > 0
    grid = (rows, 1)  # one segment of all the rank's chunks
    mine = logits.new_empty((rows, chunks), dtype=torch.float32)
    if launch:
        chunk_max_kernel[grid](logits, mine, chunks, logits.stride(0), logits.stride(1), **sizes, num_warps=num_warps)
    maxima = gather(mine).contiguous()
    every = maxima.shape[-1]
    mine = logits.new_empty((rows, chunks), dtype=torch.float32)
    if launch:
        chunk_sum_kernel[grid](logits, maxima, mine, chunks, logits.stride(0), logits.stride(1), NB=every, **sizes, num_warps=num_warps)
    sums = gather(mine).contiguous()
    y = logits.new_empty((rows, vocab), dtype=torch_dtype(output_dtype))
    if launch:
        chunk_write_kernel[grid](logits, maxima, sums, y, chunks, logits.stride(0), logits.stride(1), y.stride(0), y.stride(1),
                                 NB=every, **sizes, num_warps=num_warps)
    return y


@jit
def logprobs_bwd_kernel(
    g, lp, dx,
    stride_gr, stride_gv, stride_lr, stride_lv, stride_dr, stride_dv,
    V: tl.constexpr,
    NV: tl.constexpr,
    VOCAB_BLOCK: tl.constexpr,
):
    """Row r of dx = g - exp(lp) · Σ g, in fp32, rounded once (an order of summation like any other: the
    backward need not be batch-invariant)."""
    i_r = tl.program_id(0).to(tl.int64)
    b_sum = tl.zeros([VOCAB_BLOCK], dtype=tl.float32)
    for i_v in range(0, NV):
        o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
        b_sum += tl.load(g + i_r * stride_gr + o_v * stride_gv, mask=o_v < V, other=0.0).to(tl.float32)
    b_total = tl.sum(b_sum, axis=0)
    for i_v in range(0, NV):
        o_v = i_v * VOCAB_BLOCK + tl.arange(0, VOCAB_BLOCK)
        m_v = o_v < V
        b_g = tl.load(g + i_r * stride_gr + o_v * stride_gv, mask=m_v, other=0.0).to(tl.float32)
        b_lp = tl.load(lp + i_r * stride_lr + o_v * stride_lv, mask=m_v, other=0.0).to(tl.float32)
        tl.store(dx + i_r * stride_dr + o_v * stride_dv, (b_g - tl.exp(b_lp) * b_total).to(dx.dtype.element_ty), mask=m_v)


def logprobs_bwd(grad: Tensor, lp: Tensor, dtype: torch.dtype, *, vocab_block: int, num_warps: int) -> Tensor:
    """grad and the forward's log-probs [R, V] -> the logits' gradient [R, V] in `dtype`."""
    rows, vocab = lp.shape
    dx = lp.new_empty((rows, vocab), dtype=dtype)
    if rows == 0 or vocab == 0:
        return dx
    logprobs_bwd_kernel[(rows,)](
        grad, lp, dx,
        grad.stride(0), grad.stride(1), lp.stride(0), lp.stride(1), dx.stride(0), dx.stride(1),
        V=vocab, NV=cdiv(vocab, vocab_block), VOCAB_BLOCK=vocab_block,
        num_warps=num_warps,
    )
    return dx


class _TritonLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, out_dtype, config):
        out = logprobs_fwd(logits.reshape(-1, logits.shape[-1]), out_dtype, **config).reshape(logits.shape)
        ctx.save_for_backward(out)
        ctx.input_dtype, ctx.config = logits.dtype, config
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        vocab = out.shape[-1]
        dx = logprobs_bwd(grad.reshape(-1, vocab), out.reshape(-1, vocab), ctx.input_dtype, **ctx.config)
        return dx.reshape(out.shape), None, None


def logprobs(logits: Tensor, *, input_dtype: str, output_dtype: str, accum_dtype: str, vocab_block: int, num_warps: int) -> Tensor:
    """Full-vocabulary log-probabilities: logits [..., V] -> [..., V] in the output dtype."""
    expect_dtype(logits, input_dtype, "logprobs input")
    require_device(ID, logits)
    config = dict(vocab_block=vocab_block, num_warps=num_warps)
    if needs_grad(logits):
        return _TritonLogSoftmax.apply(logits, torch_dtype(output_dtype), config)
    return logprobs_fwd(logits.reshape(-1, logits.shape[-1]), torch_dtype(output_dtype), **config).reshape(logits.shape)


def check_constants(constants: dict) -> None:
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    if constants["input_dtype"] not in INPUT_DTYPES:
        raise ValueError(f"{ID}: input_dtype must be one of {', '.join(INPUT_DTYPES)}")
    if constants["output_dtype"] not in INPUT_DTYPES:
        raise ValueError(f"{ID}: output_dtype must be one of {', '.join(INPUT_DTYPES)}")
    block = constants["vocab_block"]
    if block & (block - 1):
        raise ValueError(f"{ID}: vocab_block must be a power of two (a tl.arange length), got {block}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"{ID}: num_warps must be a power of two <= 32")


def register(registry) -> None:
    """Register logprobs.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="logprobs", cases=ALL_CASES, fn=logprobs, check_constants=check_constants, tune=tuning.fit,
                               vocab_parallel=vocab_parallel,
                               sources=(chunk_max_kernel, chunk_sum_kernel, chunk_write_kernel, _folded_max, _folded_sum, triton_support)))
