"""The arithmetic of one linear.triton output tile, shared by its launch schemes.

The grid kernel (`triton.linear_tile`, one program per tile, masked pointer loads) and the persistent
kernel (`persistent_triton.tma_tile`, TMA loads) differ only in how a tile's x and W blocks reach the
program. What happens to them is written once, here: each K block is added into one fp32 accumulator
by `tl.dot` (started from +0.0 by the caller), then the bias is added in fp32 and the sum is rounded
once to the output dtype and stored.

Triton rewrites `dot(a, b, 0) + c` into `dot(a, b, c)`: where a tile's K loop has one block (and is
unrolled), it would start that dot's accumulator from the bias (or, in the fused row-parallel kernel,
from the running sum of the earlier leaves), which is other arithmetic than the same block in a longer
loop. Compiled for sm_90 it does (`triton.compile`, TTIR inspected; on an H200 it changed the fused
kernel's bits at one block per leaf). So a finished accumulator passes through `settled`
(`triton_support`), an opaque register copy, before anything is added to it.

A call may write its columns as several outputs (`output_part`): sibling projections of one input
(q, k and v; gate and up) whose weights lie one after the other in memory run as one GEMM over the
joined weight, each part's columns stored as a [M, width] tensor of its own in one planar buffer. Every
part's width is whole BLOCK_N tiles, so each tile belongs to one part and its columns sit where they sit
in that part's own call: only the store address moves, never the arithmetic.
"""

from __future__ import annotations

from ..triton_support import jit, settled, tl


@jit
def accumulate(b_x, b_w, b_acc, DOT_IN_FP32: tl.constexpr):
    """b_acc + b_x [BLOCK_M, BLOCK_K] @ b_w [BLOCK_K, BLOCK_N], in fp32."""
    if DOT_IN_FP32:  # the interpreter has no bfloat16 arithmetic; bf16 -> fp32 is exact
        b_x, b_w = b_x.to(tl.float32), b_w.to(tl.float32)
    # ieee: fp32 operands are multiplied in full fp32, never silently in tf32.
    return tl.dot(b_x, b_w, b_acc, input_precision="ieee")


@jit
def fold_leaf(b_total, b_acc, INTERPRETED: tl.constexpr):
    """The running sum of a row-parallel tile's finished leaves plus the next one, in fp32. settled:
    the leaf's dot must not start from the running sum where a leaf is one block (module doc)."""
    return b_total + settled(b_acc, INTERPRETED)


@jit
def leaf_block(i, K: tl.constexpr, G: tl.constexpr, NK: tl.constexpr, BLOCK_K: tl.constexpr):
    """(columns, mask) of block i of a row-parallel fold's one loop over G leaves of NK blocks each: block
    i % NK of leaf i // NK, from the leaf's first column (`reference.leaf_bounds`: leaf g starts at
    floor(g K / G)), masked at the leaf's end."""
    o_k = (i % NK) * BLOCK_K + tl.arange(0, BLOCK_K)
    if K % G == 0:
        m_k = o_k < K // G
        o_k += (i // NK) * (K // G)
    else:
        o_first = (i // NK) * K // G
        m_k = o_k < ((i // NK) + 1) * K // G - o_first
        o_k += o_first
    return o_k, m_k


@jit
def output_part(y, b, i_n, M, N, N1: tl.constexpr, N2: tl.constexpr, BLOCK_N: tl.constexpr):
    """(y, bias, i_n, N) of the part holding column tile i_n, where y is planar: part p (columns
    [0, N1), [N1, N2), [N2, N)) as a contiguous [M, width] block from element M * start. N2 = N for
    two parts; widths are whole BLOCK_N tiles (the caller's check). Its row stride is its width."""
    first = i_n * BLOCK_N
    start = tl.where(first >= N2, N2, tl.where(first >= N1, N1, 0))
    end = tl.where(first >= N2, N, tl.where(first >= N1, N2, N1))
    return y + M.to(tl.int64) * start, b + start, i_n - start // BLOCK_N, end - start


@jit
def store_tile(b_acc, b, y, i_m, i_n, M, N, stride_ym, stride_yn,
               HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRETED: tl.constexpr,
               N1: tl.constexpr = 0, N2: tl.constexpr = 0):
    """Tile (i_m, i_n) of y: the accumulator plus the bias in fp32, rounded once; rows past M and columns
    past N are not stored. N1 > 0: y is planar, in parts split at columns N1 and N2 (`output_part`)."""
    b_acc = settled(b_acc, INTERPRETED)
    if N1 > 0:
        y, b, i_n, N = output_part(y, b, i_n, M, N, N1, N2, BLOCK_N)
        stride_ym = N
    o_m = i_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    if HAS_BIAS:
        b_acc += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    p_y = y + o_m[:, None] * stride_ym + o_n[None, :] * stride_yn
    tl.store(p_y, b_acc.to(y.dtype.element_ty), mask=(o_m < M)[:, None] & m_n[None, :])
