"""linear.triton's launch for a few rows (decode batches): every tile computed transposed, yᵀ = W xᵀ.

At M = 1 the decode tile (64 rows of x by 32 weight columns) stages a 64-row x block of which one row is
real: most of its shared memory holds zeros, one program fits an SM, and few weight bytes are in flight.
Here a program owns SWAPPED_BLOCK_N weight rows and BLOCK_M = 16 rows of x (tl.dot's least), and takes
`tl.dot(W block [BLOCK_N, BLOCK_K], xᵀ block [BLOCK_K, BLOCK_M])`: the weight is the tensor core's wide
operand, as in cuBLAS's decode kernels. Each output element is still `tile_triton`'s arithmetic: the same
bf16 products over K in ascending BLOCK_K blocks into one fp32 accumulator from +0.0, the bias in fp32,
one rounding (`store_tile`, given the transposed accumulator). On an H200 (triton 3.6) every swapped tile
swept gave the bits of linear.triton's training tile at M = 1, 16 and 64 at every Qwen3-0.6B and
Qwen3-8B projection shape (`benchmarks/sweep_decode_swap.py`), 20-25% faster than the decode tile at
M = 1 on the larger shapes; `tests/ops/linear/test_swapped_triton.py` checks the bits on the GPU.

So the launch is a speed choice, like the persistent one: `linear.triton` takes it for bfloat16 calls of
at most SWAPPED_MAX_ROWS rows on a GPU (`fits`), with the contract's BLOCK_K and stages, and so does
`linear.row_parallel.triton`'s sequential fold (G leaves folded in order in one program, as its
`fused_kernel` does; running the leaves in parallel and folding them after was slower at Qwen3-8B's
o_proj and down_proj, docs/experiments.md). Past 16 rows a program would re-read its weight block for
every 16 rows, so larger batches keep the grid and persistent launches. The interpreter computes
`tl.dot` through numpy, whose bits may depend on the operands' orientation, so on the CPU the kernel is
tested on its own (values, masks, parts, folds), not against the grid kernel's bits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import triton_support
from ..triton_support import after_upstream, cdiv, jit, tl
from . import tile_triton

SWAPPED_MAX_ROWS = 16
SWAPPED_BLOCK_M = 16  # rows of x a program holds: tl.dot's least N
SWAPPED_BLOCK_N = 64  # weight rows a program owns: the Hopper tensor core's (wgmma) least M
SWAPPED_NUM_WARPS = 4  # one warpgroup
SHARED_MEMORY_BYTES = 200 * 1024


@jit
def _block(x, w, b_acc, o_m, o_n, o_k, m_m, m_n, m_k, stride_xm, stride_xk, stride_wn, stride_wk, DOT_IN_FP32: tl.constexpr):
    """b_acc [BLOCK_N, BLOCK_M] plus the K block o_k of W's rows o_n times xᵀ's columns o_m."""
    b_w = tl.load(w + o_n[:, None] * stride_wn + o_k[None, :] * stride_wk, mask=m_n[:, None] & m_k[None, :], other=0.0)
    b_xt = tl.load(x + o_k[:, None] * stride_xk + o_m[None, :] * stride_xm, mask=m_k[:, None] & m_m[None, :], other=0.0)
    return tile_triton.accumulate(b_w, b_xt, b_acc, DOT_IN_FP32)


@jit(do_not_specialize=["M"], dependent=True)
def linear_swapped_kernel(
    x, w, b, y,
    M, N,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    K: tl.constexpr,
    G: tl.constexpr,
    NK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    N1: tl.constexpr = 0,
    N2: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    """Output tile (i_m, i_n), accumulated as its transpose [BLOCK_N, BLOCK_M]. G > 1: K is G leaves
    (`reference.leaf_bounds`) folded in order, as `row_parallel_triton.fused_kernel` folds them: each
    leaf's NK blocks into an accumulator from +0.0, masked at the leaf's end, each finished leaf added to
    a running fp32 sum; one loop over every leaf's blocks, so loads pipeline across leaf ends."""
    after_upstream(PDL)
    i_n, i_m = tl.program_id(0), tl.program_id(1)
    o_n = i_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = i_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_n, m_m = o_n < N, o_m < M

    b_acc = tl.full([BLOCK_N, BLOCK_M], 0.0, dtype=tl.float32)
    if G == 1:
        for i_k in range(0, NK):
            o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
            b_acc = _block(x, w, b_acc, o_m, o_n, o_k, m_m, m_n, o_k < K, stride_xm, stride_xk, stride_wn, stride_wk, DOT_IN_FP32)
    else:
        b_total = tl.full([BLOCK_N, BLOCK_M], -0.0, dtype=tl.float32)  # -0.0 + l0 is l0, bit for bit
        for i in range(0, G * NK):
            o_k, m_k = tile_triton.leaf_block(i, K, G, NK, BLOCK_K)
            b_acc = _block(x, w, b_acc, o_m, o_n, o_k, m_m, m_n, m_k, stride_xm, stride_xk, stride_wn, stride_wk, DOT_IN_FP32)
            if i % NK == NK - 1:
                b_total = tile_triton.fold_leaf(b_total, b_acc, DOT_IN_FP32)
                b_acc = tl.full([BLOCK_N, BLOCK_M], 0.0, dtype=tl.float32)
        b_acc = b_total
    tile_triton.store_tile(tl.trans(b_acc), b, y, i_m, i_n, M, N, stride_ym, stride_yn, HAS_BIAS, BLOCK_M, BLOCK_N,
                           DOT_IN_FP32, N1, N2)


def parts_fit(n: int, splits: tuple[int, int]) -> bool:
    """Whether every part of a joined call (`splits` = (N1, N2), N1 > 0) is whole SWAPPED_BLOCK_N tiles."""
    return splits[0] == 0 or all(width % SWAPPED_BLOCK_N == 0 for width in (splits[0], splits[1] - splits[0], n - splits[1]))


def fits(x: Tensor, n: int, splits: tuple[int, int] = (0, 0)) -> bool:
    """Whether `linear.triton` takes this launch for x [M, K] against N weight rows: bfloat16 on a GPU
    (where its bits were measured equal to the grid kernel's), at most SWAPPED_MAX_ROWS rows, joined
    parts of whole tiles."""
    return x.is_cuda and x.dtype == torch.bfloat16 and 0 < x.shape[0] <= SWAPPED_MAX_ROWS and parts_fit(n, splits)


def linear_fwd_swapped(x: Tensor, weight: Tensor, bias: Tensor | None, y: Tensor, *, block_k: int, num_stages: int,
                       splits: tuple[int, int] = (0, 0), num_leaves: int = 1, **_tile) -> None:
    """x [M, K], weight [N, K], bias [N] -> y [M, N] (written), BLOCK_K and the stages (as many as fit
    in shared memory) from the contract's tile, its other dimensions this launch's. With `splits` =
    (N1, N2), N1 > 0, y's elements are planar parts of whole SWAPPED_BLOCK_N tiles (`parts_fit`). With
    `num_leaves` = G > 1, K's G leaves are folded in order (linear.row_parallel.triton's `sequential` tree)."""
    m, k = x.shape
    n = weight.shape[0]
    if m == 0 or n == 0:
        return
    if not parts_fit(n, splits):
        raise ValueError(f"swapped launch: parts split at {splits} are not whole {SWAPPED_BLOCK_N}-column tiles")
    stage_bytes = (SWAPPED_BLOCK_N + SWAPPED_BLOCK_M) * block_k * x.element_size()
    grid = (cdiv(n, SWAPPED_BLOCK_N), cdiv(m, SWAPPED_BLOCK_M))
    linear_swapped_kernel[grid](
        x, weight, x if bias is None else bias.contiguous(), y,
        m, n,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        K=k, G=num_leaves, NK=max(1, cdiv(cdiv(k, num_leaves), block_k)), HAS_BIAS=bias is not None,
        DOT_IN_FP32=triton_support.interpreting(),
        BLOCK_M=SWAPPED_BLOCK_M, BLOCK_N=SWAPPED_BLOCK_N, BLOCK_K=block_k, N1=splits[0], N2=splits[1],
        num_warps=SWAPPED_NUM_WARPS, num_stages=max(1, min(num_stages, SHARED_MEMORY_BYTES // stage_bytes)),
    )
