"""Batch-invariant y = x Wᵀ (+ b) as one Triton GEMM: pinned tiles, no split-K, fp32 accumulation.

Program (i_m, i_n) owns a BLOCK_M x BLOCK_N output tile and walks K in ascending blocks of BLOCK_K,
accumulating `tl.dot` of the x and Wᵀ tiles into one fp32 accumulator; the bias is added in fp32 and
the sum rounded once to the output dtype. Rows past M and columns past N load zeros and are never
stored; K past the end loads zeros on both operands, adding +0.0 products. The tile shape and launch
configuration are contract constants, so they depend on (N, K) and the dtype through the contract and
never on M: a row's sequence of operations is the same whether it shares the call with 0 or 4095 other
rows, whichever tile row it lands in. K is a compile-time constant (a layer's K never changes), which
also keeps the loop bound a Python int for Triton 3.6's interpreter, whose runtime scalars are
one-element arrays that numpy >= 2.4 refuses to turn into a `range` bound.

Where a row of K elements is 16-byte aligned, `linear.triton` launches the same tiles persistently,
one program per SM loading them through TMA (`persistent_triton.py`): on an H200 that reached
0.93-1.06x cuBLAS at M >= 1024 where this grid kernel reached 0.86-1.03x with the same tiles
(benchmarks/sweep_gemm.py). The two launches run each tile's program the same way, so they give the same bits
(tests/ops/linear/test_triton.py); which one a call takes is a speed choice: wide (training) tiles always
launch persistently, narrow (decode) tiles one program per tile below `PERSISTENT_MIN_ROWS` rows and
persistently from there. Below that, bfloat16 calls of at most 16 rows on a GPU take a third launch,
each tile computed transposed with the weight as the tensor core's wide operand (`swapped_triton.py`):
the same bits, measured, and 20-25% faster at M = 1 on Qwen3-8B's larger projections.

The grid kernel also computes the leaf partials of `linear.row_parallel.triton` (`row_parallel_triton.py`):
a third grid axis runs one leaf per program, offsetting x and W by the leaf's first K column and
writing its fp32 accumulator, unrounded and without bias, to its own plane of a [G, M, N] buffer. The
leaves are `reference.leaf_bounds`' (leaf i starts at floor(i K / G)), and the K mask stops every
leaf at its own end. Every leaf runs the loop of the widest, ceil(K / G) columns (`leaf_blocks`), a
function of (K, G, BLOCK_K) alone, so a tensor-parallel rank running its own leaves runs the same loop
as one device; where a leaf one column short takes a block of masked +0.0 products more than it needs,
they leave its accumulator's bits as they are (started from +0.0, it never holds -0.0). Where G
divides K the leaf width and offsets are compile-time constants, as before other K were allowed, so
those kernels compile as before.

The backward pass uses ordinary matmuls: gradients must be correct, not batch-invariant.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from ..triton_support import cdiv, jit, needs_grad, require_device, tl, triton_available
from . import persistent_triton, reference, swapped_triton, tile_triton
from .reference import linear_grads
from . import tuning

ID = "linear.triton"
DOT_DTYPES = ("bfloat16", "float16", "float32")

# Pipeline stages decide only when tiles are loaded, never the arithmetic. A tile chosen for bf16 runs
# with as many of its stages as fit in 200 KiB of shared memory (an H100/H200 SM has 227 KiB) when its
# operands are wider: fp32 in the battery's float32 pass. The count depends on the tile and dtype alone.
SHARED_MEMORY_BYTES = 200 * 1024


# The persistent launch was measured better with the training tiles (128 or 256 columns) at M >= 1024. With the
# 32-column decode tile it ran 1.4-2.4x slower than one program per tile at M = 1 and 16 and 0-15% faster at
# M = 64 (Qwen3-8B's shapes on an H200, `benchmarks/profile_gpu.py decode-launch`), the same bits either way.
PERSISTENT_MIN_BLOCK_N = 128
PERSISTENT_MIN_ROWS = 64  # where a narrower tile launches persistently too


def pipeline_stages(num_stages: int, block_m: int, block_n: int, block_k: int, itemsize: int) -> int:
    return max(1, min(num_stages, SHARED_MEMORY_BYTES // ((block_m + block_n) * block_k * itemsize)))


def hopper_constants(n: int, k: int, dtype: str = "bfloat16") -> dict:
    """Every constant of linear.triton for an [N, K] weight on Hopper, with its training tile (`tuning.hopper_tile`)."""
    return dict(input_dtype=dtype, weight_dtype=dtype, output_dtype=dtype, accum_dtype="float32", **tuning.hopper_tile(n, k))


@jit
def linear_tile(
    x, w, b, y, i_m, i_n, M, N,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    K, NK: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, N1: tl.constexpr = 0, N2: tl.constexpr = 0,
):
    """Output tile (i_m, i_n) over K columns of x and w (a compile-time constant where the caller
    has one, else a leaf's width at run time), through masked pointer loads; its arithmetic is
    `tile_triton`'s. N1 > 0: y is planar, parts split at columns N1 and N2 (`tile_triton.output_part`)."""
    o_m = i_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m, m_n = o_m < M, o_n < N

    b_acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    for i_k in range(0, NK):
        o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
        m_k = o_k < K
        p_x = x + o_m[:, None] * stride_xm + o_k[None, :] * stride_xk
        p_w = w + o_k[:, None] * stride_wk + o_n[None, :] * stride_wn
        b_x = tl.load(p_x, mask=m_m[:, None] & m_k[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        b_w = tl.load(p_w, mask=m_k[:, None] & m_n[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        b_acc = tile_triton.accumulate(b_x, b_w, b_acc, DOT_IN_FP32)
    tile_triton.store_tile(b_acc, b, y, i_m, i_n, M, N, stride_ym, stride_yn, HAS_BIAS, BLOCK_M, BLOCK_N, DOT_IN_FP32, N1, N2)


# One compiled kernel for every M: nothing about M may reach the code, the leaf planes' stride M·N included.
@jit(do_not_specialize=["M", "stride_yg"])
def linear_fwd_kernel(
    x, w, b, y,
    M, N,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_yg, stride_ym, stride_yn,
    K: tl.constexpr,
    G: tl.constexpr,
    FIRST_LEAF: tl.constexpr,
    NK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    N1: tl.constexpr = 0,
    N2: tl.constexpr = 0,
):
    """Plane i_g of y: leaf FIRST_LEAF + i_g of K columns split into G leaves, x and w holding the
    columns from leaf FIRST_LEAF's first on (a tensor-parallel rank's shard, or all of K). N1 > 0 (one
    leaf): y is planar, in parts split at columns N1 and N2 (`tile_triton.output_part`)."""
    i_m, i_n, i_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if K % G == 0:
        o_first = i_g.to(tl.int64) * (K // G)
        width = K // G
    else:  # reference.leaf_bounds: leaf i starts at floor(i K / G)
        i_leaf = i_g.to(tl.int64) + FIRST_LEAF
        o_first = i_leaf * K // G - FIRST_LEAF * K // G
        width = (i_leaf + 1) * K // G - i_leaf * K // G
    x += o_first * stride_xk
    w += o_first * stride_wk
    y += i_g.to(tl.int64) * stride_yg
    linear_tile(x, w, b, y, i_m, i_n, M, N, stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                width, NK, HAS_BIAS, DOT_IN_FP32, BLOCK_M, BLOCK_N, BLOCK_K, N1, N2)


def launch(x: Tensor, weight: Tensor, bias: Tensor | None, y: Tensor, *, block_m: int, block_n: int, block_k: int,
           num_warps: int, num_stages: int, num_leaves: int = 1, global_k: int | None = None, first_leaf: int = 0,
           splits: tuple[int, int] = (0, 0)) -> None:
    """x [M, K], weight [N, K], bias [N] -> y [L, M, N]: plane l is leaf first_leaf + l of `global_k`
    (default K) columns split into `num_leaves` leaves by `reference.leaf_bounds`, x Wᵀ over that leaf's
    columns (+ bias), rounded to y's dtype. x and weight hold exactly the columns of those L leaves.
    `splits` = (N1, N2) with N1 > 0 (one leaf): y's elements are planar parts instead (`joined_fwd`)."""
    count, m, n = y.shape
    global_k = x.shape[1] if global_k is None else global_k
    if (global_k, first_leaf, count) != (x.shape[1], 0, num_leaves):  # a rank's shard: refuse one of the wrong width
        reference.shard_bounds(x.shape[1], num_leaves, range(first_leaf, first_leaf + count), global_k)
    if m == 0 or n == 0 or count == 0:
        return
    num_stages = pipeline_stages(num_stages, block_m, block_n, block_k, x.element_size())
    grid = (cdiv(m, block_m), cdiv(n, block_n), count)
    linear_fwd_kernel[grid](
        x, weight, x if bias is None else bias.contiguous(), y,
        m, n,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1), y.stride(2),
        K=global_k, G=num_leaves, FIRST_LEAF=first_leaf, NK=leaf_blocks(global_k, num_leaves, block_k),
        HAS_BIAS=bias is not None,
        DOT_IN_FP32=triton_support.interpreting(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, N1=splits[0], N2=splits[1],
        num_warps=num_warps, num_stages=num_stages,
    )


def leaf_blocks(k: int, num_leaves: int, block_k: int) -> int:
    """The K blocks every leaf's loop runs: those of the widest leaf, ceil(K / G) columns (module doc)."""
    return cdiv(cdiv(k, num_leaves), block_k)


def linear_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, out_dtype: torch.dtype, *, block_m: int, block_n: int,
               block_k: int, num_warps: int, num_stages: int, splits: tuple[int, int] = (0, 0)) -> Tensor:
    """x [M, K], weight [N, K], bias [N] -> [M, N] in `out_dtype`: the swapped launch for a few bfloat16
    rows on a GPU (`swapped_triton.fits`), the persistent TMA launch where K allows it and the tile is wide
    or M large, else one program per tile; the same bits each way. With
    `splits` (N1 > 0) the M x N elements are planar parts instead (`joined_fwd`)."""
    y = x.new_empty((x.shape[0], weight.shape[0]), dtype=out_dtype)
    num_stages = pipeline_stages(num_stages, block_m, block_n, block_k, x.element_size())
    tiles = dict(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages, splits=splits)
    if swapped_triton.fits(x, weight.shape[0], splits):
        swapped_triton.linear_fwd_swapped(x, weight, bias, y, **tiles)
    elif persistent_triton.fits(x.shape[1], x.dtype) and (block_n >= PERSISTENT_MIN_BLOCK_N or x.shape[0] >= PERSISTENT_MIN_ROWS):
        persistent_triton.linear_fwd_persistent(x, weight, bias, y, **tiles)
    else:
        launch(x, weight, bias, y[None], **tiles)
    return y


def can_join(widths: list[int], *, block_n: int, **_) -> bool:
    """Whether sibling weights of these widths (rows) can run as one launch: 2 or 3 parts, each whole
    BLOCK_N tiles, so no tile holds two parts' columns."""
    return len(widths) in (2, 3) and all(w > 0 and w % block_n == 0 for w in widths)


def joined_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, widths: list[int], *, input_dtype: str, weight_dtype: str,
               output_dtype: str, accum_dtype: str, **tiles) -> list[Tensor]:
    """x [M, K] and sibling weights joined as weight [sum(widths), K] (`joined.joined`) -> one contiguous
    [M, width] output per part from one launch, each bitwise what `linear` gives that part's own weight:
    the tiles are the same and every part starts on a tile boundary (`can_join`), so a column's tile
    computes it as the part's own call does; only the store address moves (`tile_triton.output_part`)."""
    expect_dtype(x, input_dtype, "linear input")
    expect_dtype(weight, weight_dtype, "linear weight")
    require_device(ID, x, weight, bias)
    splits = (widths[0], widths[0] + widths[1] if len(widths) == 3 else weight.shape[0])
    y = linear_fwd(x, weight, bias, torch_dtype(output_dtype), splits=splits, **tiles).view(-1)
    m, parts, start = x.shape[0], [], 0
    for width in widths:
        parts.append(y[m * start : m * (start + width)].view(m, width))
        start += width
    return parts


def _over_rows(fwd, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if x.dim() == 2:  # the packed [T, K] rows models pass: no reshapes (a few us of host time each)
        return fwd(x, weight, bias)
    return fwd(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])


class _TritonLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, fwd):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _over_rows(fwd, x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        return (*linear_grads(ctx, grad), None)


def run(impl_id: str, fwd, x: Tensor, weight: Tensor, bias: Tensor | None, input_dtype: str, weight_dtype: str) -> Tensor:
    """`fwd` (x [M, K], weight [N, K], bias [N] -> [M, N]) over the rows of x [..., K] -> [..., N], after
    checking the inputs against the contract; through autograd, with `linear_grads`, when it records."""
    expect_dtype(x, input_dtype, "linear input")
    expect_dtype(weight, weight_dtype, "linear weight")
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: input has K = {x.shape[-1]}, weight has K = {weight.shape[-1]}")
    require_device(impl_id, x, weight, bias)
    if needs_grad(x, weight, bias):
        return _TritonLinear.apply(x, weight, bias, fwd)
    return _over_rows(fwd, x, weight, bias)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, input_dtype: str, weight_dtype: str, output_dtype: str,
           accum_dtype: str, block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int) -> Tensor:
    """x [..., K], weight [N, K], bias [N] -> [..., N]."""
    fwd = functools.partial(linear_fwd, out_dtype=torch_dtype(output_dtype), block_m=block_m, block_n=block_n, block_k=block_k,
                            num_warps=num_warps, num_stages=num_stages)
    return run(ID, fwd, x, weight, bias, input_dtype, weight_dtype)


def bench_op():
    """y = x Wᵀ with each weight's Hopper constants: the op `benchmarks/bench.py` times against cuBLAS."""
    return lambda x, w, b=None: linear(x, w, b, **hopper_constants(*w.shape, str(x.dtype).removeprefix("torch.")))


def check_constants(constants: dict, impl_id: str = ID) -> None:
    """Refuse dtypes and tiles the kernel does not implement (ValueError naming `impl_id`)."""
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{impl_id} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    if constants["input_dtype"] != constants["weight_dtype"] or constants["input_dtype"] not in DOT_DTYPES:
        raise ValueError(f"{impl_id} needs input_dtype = weight_dtype, one of {', '.join(DOT_DTYPES)}")
    for name in ("block_m", "block_n", "block_k"):
        value = constants[name]
        if value < 16 or value & (value - 1):
            raise ValueError(f"{impl_id}: {name} must be a power of two >= 16 (tl.dot's smallest tile), got {value}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16) or constants["num_stages"] < 1:
        raise ValueError(f"{impl_id}: num_warps must be a power of two <= 16 and num_stages >= 1")


def register(registry) -> None:
    """Register linear.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="linear", cases=ALL_CASES, fn=linear, check_constants=check_constants, tune=tuning.fit,
                               sources=(linear_fwd_kernel, linear_tile, tile_triton, persistent_triton, swapped_triton, triton_support),
                               joined=(joined_fwd, can_join)))
