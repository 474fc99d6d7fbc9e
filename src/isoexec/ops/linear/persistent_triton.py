"""linear.triton's persistent launch: one program per SM walks output tiles, loading them through TMA.

A fixed number of programs (the SM count, or fewer when there are fewer tiles) each take tiles
`pid, pid + P, pid + 2P, …` in grouped order (GROUP_M tile rows per band, so consecutive tiles share
weight columns in L2). A tile's x and W blocks arrive through tensor descriptors (the Hopper TMA unit);
a box reaching past M, N or K reads +0.0, which is what the grid kernel's masked loads read. Only the
loads differ from the grid kernel's `triton.linear_tile`; both hand their blocks to `tile_triton`,
which holds the arithmetic: K in ascending BLOCK_K blocks, `tl.dot` into one fp32 accumulator from
+0.0, the bias added in fp32, one rounding. Which program computes a tile, when, and how its operands
reach shared memory cannot enter that arithmetic, so for the same constants the output is bitwise the
grid kernel's: `tests/ops/linear/test_triton.py` checks it under the interpreter, and on an H200
`benchmarks/sweep_gemm.py` found it so at Qwen3-8B shapes.

With G > 1 leaves the same kernel runs `row_parallel_triton`'s sequential fold: each leaf's blocks
into an accumulator from +0.0, each finished leaf added to a running fp32 sum. A TMA box cannot stop
at a leaf's end, so every leaf must be whole BLOCK_K blocks (`fits_leaves`).

TMA needs a unit-stride row and 16-byte aligned row strides: `fits` says whether a K (and dtype) can
take this path, a property of the weight's shape, never of M. Where it can, `linear.triton` picks the
launch by tile width and M (`PERSISTENT_MIN_ROWS`), which the bits do not depend on.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import triton_support
from ..triton_support import after_upstream, cdiv, jit, tl, triton_available
from . import tile_triton

if triton_available():
    from triton.tools.tensor_descriptor import TensorDescriptor

GROUP_M = 8


@jit
def grouped_tile(tile, num_m, num_n, GROUP: tl.constexpr):
    """Tile index -> (i_m, i_n), GROUP tile rows at a time, column by column within a band."""
    band = tile // (GROUP * num_n)
    first_m = band * GROUP
    rows_in_band = tl.minimum(num_m - first_m, GROUP)
    return first_m + tile % rows_in_band, (tile % (GROUP * num_n)) // rows_in_band


@jit
def tma_block(x_desc, w_desc, b_acc, i_m, i_n, i_k, DOT_IN_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """b_acc plus the product of K block i_k of the tile's x rows and W columns (loaded through TMA)."""
    b_x = x_desc.load([i_m * BLOCK_M, i_k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
    b_w = tl.trans(w_desc.load([i_n * BLOCK_N, i_k * BLOCK_K]))  # [BLOCK_K, BLOCK_N]
    if DOT_IN_FP32:
        # numpy's matmul sums a column-major operand in an order that depends on the tile shape:
        # selecting under a row-major mask makes a row-major copy (NaN and -0.0 kept), as the
        # grid kernel's loads are.
        m_all = (tl.arange(0, BLOCK_K) >= 0)[:, None] & (tl.arange(0, BLOCK_N) >= 0)[None, :]
        b_w = tl.where(m_all, b_w, b_w)
    return tile_triton.accumulate(b_x, b_w, b_acc, DOT_IN_FP32)


@jit
def tma_tile(
    x_desc, w_desc, b, y, tile, M, N, stride_ym, stride_yn,
    NK: tl.constexpr, G: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    N1: tl.constexpr = 0, N2: tl.constexpr = 0,
):
    """One output tile over G leaves of NK blocks each. G = 1: every K block into one accumulator.
    G > 1 (the row-parallel fold, `row_parallel_triton`): each leaf's blocks into an accumulator from
    +0.0, folded into a running sum after the leaf. The leaf's blocks are a loop of their own, so
    Triton pipelines their loads as it does the G = 1 loop's; one flat loop over every block with the
    fold under a condition reached 0.56-0.74 of cuBLAS on an H200 where this reached 0.78-0.95
    (docs/experiments.md)."""
    i_m, i_n = grouped_tile(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP)
    if G == 1:
        b_acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
        for i_k in range(0, NK):
            b_acc = tma_block(x_desc, w_desc, b_acc, i_m, i_n, i_k, DOT_IN_FP32, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        b_total = tl.full([BLOCK_M, BLOCK_N], -0.0, dtype=tl.float32)  # -0.0 + l0 is l0, bit for bit
        for i_g in range(0, G):
            b_leaf = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
            for i_b in range(0, NK):
                b_leaf = tma_block(x_desc, w_desc, b_leaf, i_m, i_n, i_g * NK + i_b, DOT_IN_FP32, BLOCK_M, BLOCK_N, BLOCK_K)
            b_total = tile_triton.fold_leaf(b_total, b_leaf, DOT_IN_FP32)
        b_acc = b_total
    tile_triton.store_tile(b_acc, b, y, i_m, i_n, M, N, stride_ym, stride_yn, HAS_BIAS, BLOCK_M, BLOCK_N, DOT_IN_FP32, N1, N2)


# One compiled kernel for every M, as for the grid kernel.
@jit(do_not_specialize=["M", "num_programs"], dependent=True)
def linear_persistent_kernel(
    x_desc, w_desc, b, y,
    M, N, num_programs,
    stride_ym, stride_yn,
    NK: tl.constexpr,
    G: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    INTERPRETED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    N1: tl.constexpr = 0,
    N2: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    after_upstream(PDL)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if INTERPRETED:  # the interpreter cannot take a runtime `range` bound; the same tiles in the same order
        tile = tl.program_id(0)
        while tile < num_tiles:
            tma_tile(x_desc, w_desc, b, y, tile, M, N, stride_ym, stride_yn, NK, G, HAS_BIAS, DOT_IN_FP32, BLOCK_M, BLOCK_N, BLOCK_K, GROUP, N1, N2)
            tile += num_programs
    else:
        for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=True):
            tma_tile(x_desc, w_desc, b, y, tile, M, N, stride_ym, stride_yn, NK, G, HAS_BIAS, DOT_IN_FP32, BLOCK_M, BLOCK_N, BLOCK_K, GROUP, N1, N2)


def fits(k: int, dtype: torch.dtype) -> bool:
    """Whether rows of K elements of `dtype` meet TMA's 16-byte stride alignment."""
    return (k * dtype.itemsize) % 16 == 0


def fits_leaves(k: int, num_leaves: int, block_k: int) -> bool:
    """Whether K splits into `num_leaves` leaves of whole BLOCK_K blocks: a TMA box cannot stop at a
    leaf's end, so a leaf must end where a block does (one leaf ends at K, where boxes read +0.0). A K
    that G does not divide never does: its leaves (`reference.leaf_bounds`) are of two widths one apart."""
    return num_leaves == 1 or (k % num_leaves == 0 and (k // num_leaves) % block_k == 0)


def _tma_ready(t: Tensor) -> Tensor:
    """t, or a contiguous copy (the same bits) where its layout cannot be described to TMA."""
    if t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
        return t.contiguous()
    return t


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def linear_fwd_persistent(x: Tensor, weight: Tensor, bias: Tensor | None, y: Tensor, *, block_m: int, block_n: int,
                          block_k: int, num_warps: int, num_stages: int, num_leaves: int = 1,
                          splits: tuple[int, int] = (0, 0)) -> None:
    """x [M, K], weight [N, K], bias [N] -> y [M, N] (written), where `fits(K, x.dtype)`. With
    `num_leaves` = G > 1, K is G leaves of whole BLOCK_K blocks (`fits_leaves`), folded in order. With
    `splits` = (N1, N2), N1 > 0, y's elements are planar parts (`tile_triton.output_part`)."""
    m, k = x.shape
    n = weight.shape[0]
    if m == 0 or n == 0:
        return
    if not fits_leaves(k, num_leaves, block_k):
        raise ValueError(f"persistent launch: K = {k} is not {num_leaves} leaves of whole {block_k}-column blocks")
    x, weight = _tma_ready(x), _tma_ready(weight)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    num_programs = min(_num_sms(x.device), cdiv(m, block_m) * cdiv(n, block_n))
    linear_persistent_kernel[(num_programs,)](
        x_desc, w_desc, x if bias is None else bias.contiguous(), y,
        m, n, num_programs,
        y.stride(0), y.stride(1),
        NK=cdiv(k // num_leaves, block_k), G=num_leaves, HAS_BIAS=bias is not None,
        DOT_IN_FP32=triton_support.interpreting(), INTERPRETED=triton_support.interpreting(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M, N1=splits[0], N2=splits[1],
        num_warps=num_warps, num_stages=num_stages,
    )
