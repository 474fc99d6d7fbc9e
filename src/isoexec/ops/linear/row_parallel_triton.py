"""Batch-invariant row-parallel y = x Wᵀ (+ b) (o_proj, down_proj) on linear.triton's kernel.

K is split into `num_leaves` = G contiguous leaves by `reference.leaf_bounds` (leaf i starts at
floor(i K / G): K/G columns each where G divides K, widths one apart elsewhere). One launch with a
third grid axis over the leaves computes each leaf's partial exactly as linear.triton computes a whole
row: ascending BLOCK_K blocks of the leaf into one fp32 accumulator starting from 0, masked at the
leaf's own end (so a leaf need not be whole BLOCK_K blocks), written unrounded to plane g of a
[G, M, N] fp32 buffer. The G partials are then combined by the fixed `leaf_tree` (`reduce.tree_sum`,
the lower leaf on the left), the bias added in fp32, and the sum rounded once. The tiles depend only on
the contract, never on M, and the combine is elementwise, so a row's bits do not depend on its batch.

A tensor-parallel rank owning a contiguous run of leaves (`reference.rank_leaves`) computes
`leaf_partials` on its K shard (`reference.leaf_columns`), given the whole K and its leaves; every
rank gathers all partials (bytes only) and calls `combine_partials`, which gives the same bits as one
device at TP = 1 (the impl's `leaf_parts`, `row_parallel_partials` and `row_parallel_fold`, are these two). The forward never reads a tensor on the host, so it can be captured in a CUDA graph.
The [G, M, N] buffer costs G·M·N·4 bytes of memory traffic each way.

With the `sequential` leaf tree one device needs no [G, M, N] buffer: `fused_kernel` runs one program
per output tile that walks the leaves in order, each leaf's K blocks into an accumulator started from
+0.0 (the arithmetic of a leaf program above), and folds each finished leaf into a running fp32 sum,
((l0 + l1) + l2) + …, before moving on. That is the combine's sequential fold on the same partials, so
the bits equal `leaf_partials` then `combine_partials` (tested), and tensor-parallel ranks that gather
their partials still reproduce them. A balanced tree of G leaves would need log2(G) finished partials
held beside the running one, more registers than a fast tile has, so it keeps the two launches.
Where a layer's leaves are long (`persistent_fits`), the same fold runs in linear.triton's persistent
TMA kernel instead (`persistent_triton`, G leaves): the same additions in the same order, so the same
bits (tested against the leaf planes, and on an H200 against `fused_kernel`). Both hold two
accumulators; `tuning.py` gives their tiles by (N, K).

The backward pass is linear.triton's: ordinary matmuls, correct but not batch-invariant.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import reduce, triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from ..triton_support import after_upstream, cdiv, jit, require_device, tl, triton_available
from . import persistent_triton, swapped_triton, tile_triton
from . import triton as linear_triton
from . import tuning

# Leaf counts whose combine runs as one Triton kernel; others combine with torch ops (same bits).
KERNEL_LEAVES = (1, 2, 4, 8)

ID = "linear.row_parallel.triton"

def hopper_constants(n: int, k: int, dtype: str = "bfloat16") -> dict:
    """linear.triton's Hopper constants with this impl's tile for an [N, K] weight."""
    return {**linear_triton.hopper_constants(n, k, dtype), **tuning.hopper_row_parallel_tile(n, k)}


def leaf_partials(x: Tensor, weight: Tensor, *, num_leaves: int, block_m: int, block_n: int, block_k: int, num_warps: int,
                  num_stages: int, global_k: int | None = None, leaves: range | None = None) -> Tensor:
    """x [M, K], weight [N, K] -> the unrounded fp32 leaf partials [M, N, num_leaves], as a view of a
    contiguous [num_leaves, M, N] buffer (`.permute(2, 0, 1)` gives it back for an all-gather).

    A tensor-parallel rank passes the whole weight's `global_k` and its `leaves`
    (`reference.rank_leaves`); x and weight hold their columns -> [M, N, len(leaves)], those leaves'
    partials of the whole weight bit for bit (the kernel runs every leaf with the same loop)."""
    leaves = range(num_leaves) if leaves is None else leaves
    partials = x.new_empty((len(leaves), x.shape[0], weight.shape[0]), dtype=torch.float32)
    linear_triton.launch(x, weight, None, partials, block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps,
                         num_stages=num_stages, num_leaves=num_leaves, global_k=global_k, first_leaf=leaves.start)
    return partials.permute(1, 2, 0)


@jit(do_not_specialize=["numel", "N", "plane"])
def combine_kernel(p, b, y, numel, N, plane, G: tl.constexpr, BALANCED: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK: tl.constexpr):
    """y = tree(p[0], …, p[G-1]) (+ b), elementwise over [M, N]; planes `plane` elements apart. The
    additions are reduce.tree_sum's, written out: balanced_binary adds leaf i to leaf i + G/2 each round."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = o < numel
    x0 = tl.load(p + o, mask=mask, other=0.0)
    if BALANCED:
        if G == 1:
            acc = x0
        elif G == 2:
            acc = x0 + tl.load(p + plane + o, mask=mask, other=0.0)
        elif G == 4:
            x1 = tl.load(p + plane + o, mask=mask, other=0.0)
            x2 = tl.load(p + 2 * plane + o, mask=mask, other=0.0)
            x3 = tl.load(p + 3 * plane + o, mask=mask, other=0.0)
            acc = (x0 + x2) + (x1 + x3)
        else:
            x1 = tl.load(p + plane + o, mask=mask, other=0.0)
            x2 = tl.load(p + 2 * plane + o, mask=mask, other=0.0)
            x3 = tl.load(p + 3 * plane + o, mask=mask, other=0.0)
            x4 = tl.load(p + 4 * plane + o, mask=mask, other=0.0)
            x5 = tl.load(p + 5 * plane + o, mask=mask, other=0.0)
            x6 = tl.load(p + 6 * plane + o, mask=mask, other=0.0)
            x7 = tl.load(p + 7 * plane + o, mask=mask, other=0.0)
            acc = ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7))
    else:
        acc = x0
        for g in tl.static_range(1, G):
            acc = acc + tl.load(p + g * plane + o, mask=mask, other=0.0)
    if HAS_BIAS:
        acc = acc + tl.load(b + o % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + o, acc.to(y.dtype.element_ty), mask=mask)


def combine_partials(partials: Tensor, bias: Tensor | None, *, leaf_tree: str, out_dtype: torch.dtype) -> Tensor:
    """[M, N, G] fp32 leaf partials (every leaf, in order) -> [M, N] in `out_dtype`: the fixed leaf
    tree, the bias in fp32, one rounding. One kernel when the partials are `leaf_partials`' contiguous
    planes and G is in KERNEL_LEAVES, torch ops otherwise (the same additions)."""
    m, n, g = partials.shape
    planes = partials.permute(2, 0, 1)
    if g in KERNEL_LEAVES and planes.is_contiguous() and (partials.is_cuda or triton_support.interpreting()) and m * n:
        y = partials.new_empty((m, n), dtype=out_dtype)
        block = 1024
        combine_kernel[(cdiv(m * n, block),)](
            planes, planes if bias is None else bias.contiguous(), y, m * n, n, m * n,
            G=g, BALANCED=leaf_tree == "balanced_binary", HAS_BIAS=bias is not None, BLOCK=block)
        return y
    y = reduce.tree_sum(partials, leaf_tree)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


# One compiled kernel for every M, as linear.triton's.
@jit(do_not_specialize=["M"], dependent=True)
def fused_kernel(
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
    GROUP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Output tile (i_m, i_n): leaf g's NK blocks from its first column (`reference.leaf_bounds`),
    masked at the leaf's end, into `acc` from +0.0 (as `linear_tile` computes a leaf), each finished
    leaf folded into `total` in leaf order; then the bias in fp32 and one rounding. One loop over
    every leaf's blocks, so loads are pipelined across leaf boundaries. Programs take tiles in the
    persistent GEMM's grouped order (GROUP tile rows per band), so the tiles that share an x row block
    run close together and read it from L2; which program runs a tile never enters its arithmetic."""
    after_upstream(PDL)
    i_m, i_n = persistent_triton.grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP)
    o_m = i_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m, m_n = o_m < M, o_n < N
    # -0.0 + l0 is l0, bit for bit (+0.0 would turn a -0.0 leaf into +0.0).
    total = tl.full([BLOCK_M, BLOCK_N], -0.0, dtype=tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    for i in range(0, G * NK):
        o_k, m_k = tile_triton.leaf_block(i, K, G, NK, BLOCK_K)
        b_x = tl.load(x + o_m[:, None] * stride_xm + o_k[None, :] * stride_xk, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_w = tl.load(w + o_k[:, None] * stride_wk + o_n[None, :] * stride_wn, mask=m_k[:, None] & m_n[None, :], other=0.0)
        acc = tile_triton.accumulate(b_x, b_w, acc, DOT_IN_FP32)
        if i % NK == NK - 1:
            total = tile_triton.fold_leaf(total, acc, DOT_IN_FP32)
            acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    tile_triton.store_tile(total, b, y, i_m, i_n, M, N, stride_ym, stride_yn, HAS_BIAS, BLOCK_M, BLOCK_N, DOT_IN_FP32)


def fused_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, out_dtype: torch.dtype, *, num_leaves: int, block_m: int,
              block_n: int, block_k: int, num_warps: int, num_stages: int) -> Tensor:
    """x [M, K], weight [N, K], bias [N] -> [M, N]: the leaves folded in order (`sequential`), one launch:
    the persistent TMA kernel where `persistent_fits` (a property of the layer and its tile, never of
    M), else `fused_kernel`, and for a few bfloat16 rows on a GPU `swapped_triton`'s launch (the same
    fold, each tile computed transposed); the same bits each way, so a decode tile with another BLOCK_K
    may take another launch."""
    m, k = x.shape
    y = x.new_empty((m, weight.shape[0]), dtype=out_dtype)
    tiles = dict(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps,
                 num_stages=linear_triton.pipeline_stages(num_stages, block_m, block_n, block_k, x.element_size()))
    if swapped_triton.fits(x, weight.shape[0]):
        swapped_triton.linear_fwd_swapped(x, weight, bias, y, num_leaves=num_leaves, **tiles)
    elif persistent_fits(k, x.dtype, num_leaves, block_k):
        persistent_triton.linear_fwd_persistent(x, weight, bias, y, num_leaves=num_leaves, **tiles)
    else:
        fused_grid(x, weight, bias, y, num_leaves=num_leaves, **tiles)
    return y


# The persistent launch drains its load pipeline at every leaf's end. On an H200 (docs/experiments.md)
# it beat the grid kernel at Qwen3-8B's down_proj (24 blocks a leaf: 0.92-0.95 of cuBLAS against
# 0.72-0.74) and tied it at o_proj (8 blocks: 0.78-0.80 against 0.79-0.80). Shorter leaves keep the
# grid kernel, which pipelines across leaf ends: Qwen3-0.6B's o_proj and down_proj have 4 and 6.
PERSISTENT_MIN_LEAF_BLOCKS = 8


def persistent_fits(k: int, dtype: torch.dtype, num_leaves: int, block_k: int) -> bool:
    """Whether the sequential fold of a K-wide weight runs persistently: TMA rows (`persistent_triton.fits`),
    leaves of whole BLOCK_K blocks, and at least PERSISTENT_MIN_LEAF_BLOCKS of them a leaf."""
    return (persistent_triton.fits(k, dtype) and persistent_triton.fits_leaves(k, num_leaves, block_k)
            and k // num_leaves // block_k >= PERSISTENT_MIN_LEAF_BLOCKS)


def fused_grid(x: Tensor, weight: Tensor, bias: Tensor | None, y: Tensor, *, num_leaves: int, block_m: int, block_n: int,
               block_k: int, num_warps: int, num_stages: int) -> None:
    """`fused_kernel`, one program per output tile, into y [M, N]."""
    (m, k), n = x.shape, weight.shape[0]
    if m == 0 or n == 0:
        return
    fused_kernel[(cdiv(m, block_m) * cdiv(n, block_n),)](
        x, weight, x if bias is None else bias.contiguous(), y,
        m, n,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        K=k, G=num_leaves, NK=max(1, linear_triton.leaf_blocks(k, num_leaves, block_k)),
        HAS_BIAS=bias is not None,
        DOT_IN_FP32=triton_support.interpreting(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=persistent_triton.GROUP_M,
        num_warps=num_warps, num_stages=num_stages,
    )


def row_parallel_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, out_dtype: torch.dtype, *, num_leaves: int, leaf_tree: str,
                     **tiles) -> Tensor:
    """x [M, K], weight [N, K], bias [N] -> [M, N] in `out_dtype`, on one device (TP = 1): one fused
    launch for the sequential tree, leaf planes then their combine for the balanced one."""
    if leaf_tree == "sequential":
        return fused_fwd(x, weight, bias, out_dtype, num_leaves=num_leaves, **tiles)
    return combine_partials(leaf_partials(x, weight, num_leaves=num_leaves, **tiles), bias, leaf_tree=leaf_tree, out_dtype=out_dtype)


def row_parallel_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, input_dtype: str, weight_dtype: str,
                        output_dtype: str, accum_dtype: str, block_m: int, block_n: int, block_k: int, num_warps: int,
                        num_stages: int, num_leaves: int, leaf_tree: str) -> Tensor:
    """x [..., K], weight [N, K], bias [N] -> [..., N]."""
    fwd = functools.partial(row_parallel_fwd, out_dtype=torch_dtype(output_dtype), num_leaves=num_leaves, leaf_tree=leaf_tree,
                            block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages)
    return linear_triton.run(ID, fwd, x, weight, bias, input_dtype, weight_dtype)


def row_parallel_partials(x: Tensor, weight: Tensor, *, leaves: range, global_k: int, input_dtype: str, weight_dtype: str,
                          num_leaves: int, block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int, **_) -> Tensor:
    """A tensor-parallel rank's half (`Impl.leaf_parts`): x [M, K_r] and weight [N, K_r], the columns of `leaves` of
    the whole weight's `global_k` -> their fp32 partials [M, N, len(leaves)], the whole weight's bit for bit."""
    expect_dtype(x, input_dtype, "linear input")
    expect_dtype(weight, weight_dtype, "linear weight")
    require_device(ID, x, weight)
    return leaf_partials(x, weight, num_leaves=num_leaves, block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps,
                         num_stages=num_stages, global_k=global_k, leaves=leaves)


def row_parallel_fold(partials: Tensor, bias: Tensor | None, *, output_dtype: str, leaf_tree: str, **_) -> Tensor:
    """The other half: every rank's partials [M, N, G], in leaf order -> [M, N], as `row_parallel_fwd` folds them.
    The gathered partials are laid out as planes first, so the fold and its one rounding run in the combine kernel
    where one device's do (Triton's interpreter rounds to bf16 otherwise than torch's cast)."""
    planes = partials.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    return combine_partials(planes, bias, leaf_tree=leaf_tree, out_dtype=torch_dtype(output_dtype))


def bench_op(num_leaves: int = 8, leaf_tree: str = "sequential"):
    """y = x Wᵀ with each weight's Hopper tile and `num_leaves` leaves: what `benchmarks/bench.py` times against cuBLAS."""
    def op(x, w, b=None):
        return row_parallel_linear(x, w, b, **hopper_constants(*w.shape, str(x.dtype).removeprefix("torch.")),
                                   num_leaves=num_leaves, leaf_tree=leaf_tree)
    return op


def check_constants(constants: dict) -> None:
    linear_triton.check_constants(constants, ID)
    num_leaves, leaf_tree = constants["num_leaves"], constants["leaf_tree"]
    if not isinstance(num_leaves, int) or num_leaves < 1 or num_leaves & (num_leaves - 1):
        raise ValueError(f"{ID}: num_leaves must be a power of two >= 1 (the leaves of a balanced tree, and any TP size "
                         f"dividing them), got {num_leaves}")
    if leaf_tree not in reduce.TREES:
        raise ValueError(f"{ID}: leaf_tree must be one of {', '.join(reduce.TREES)}, got {leaf_tree!r}")


def register(registry) -> None:
    """Register linear.row_parallel.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="linear.row_parallel", cases=ALL_CASES, fn=row_parallel_linear,
                               check_constants=check_constants, tune=tuning.fit_row_parallel,
                               leaf_parts=(row_parallel_partials, row_parallel_fold),
                               sources=(linear_triton.linear_fwd_kernel, linear_triton.linear_tile, tile_triton, combine_kernel, fused_kernel,
                                        persistent_triton, swapped_triton, linear_triton, reduce, triton_support)))
