"""Residual add as one Triton kernel: x + residual in fp32, rounded once to the output dtype.

Program (i_r, i_n) adds a [BLOCK_R, BLOCK_N] tile of the [R, N] rows. Each element is loaded, widened
to fp32 (exact from bf16, fp16 and fp32), added and rounded, so its bits depend on its two inputs only,
never on the tile or on how many rows share the call. It is the arithmetic of `reference.add`, so the
bits are the reference's wherever both round to nearest (on a GPU; Triton's interpreter truncates
fp32 -> bf16).

The backward pass hands the gradient to both inputs with ordinary ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from ..triton_support import (
    ELEMENTWISE_WARPS, as_rows, check_fp32_elementwise, elementwise_tile, elementwise_tiles, from_rows,
    jit, load_fp32, needs_grad, require_device, tl, triton_available,
)

ID = "residual.triton"

# One compiled kernel for every number of rows.
@jit(do_not_specialize=["num_rows"])
def residual_add_fwd_kernel(
    x, r, y,
    num_rows,
    stride_xr, stride_xn, stride_rr, stride_rn,
    N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    o_r, o_n, m = elementwise_tile(num_rows, N, BLOCK_R, BLOCK_N)
    b_x = load_fp32(x, o_r, o_n, m, stride_xr, stride_xn)  # [BLOCK_R, BLOCK_N]
    b_r = load_fp32(r, o_r, o_n, m, stride_rr, stride_rn)
    tl.store(y + o_r[:, None] * N + o_n[None, :], (b_x + b_r).to(y.dtype.element_ty), mask=m)


def residual_add_fwd(x: Tensor, residual: Tensor, out_dtype: torch.dtype) -> Tensor:
    """x, residual [R, N] -> [R, N] in `out_dtype` (contiguous)."""
    rows, width = x.shape
    y = x.new_empty((rows, width), dtype=out_dtype)
    if rows == 0 or width == 0:
        return y
    grid, block_r, block_n = elementwise_tiles(rows, width)
    residual_add_fwd_kernel[grid](
        x, residual, y,
        rows,
        x.stride(0), x.stride(1), residual.stride(0), residual.stride(1),
        N=width, BLOCK_R=block_r, BLOCK_N=block_n,
        num_warps=ELEMENTWISE_WARPS,
    )
    return y


class _TritonResidualAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, out_dtype):
        ctx.dtypes = x.dtype, residual.dtype
        return from_rows(residual_add_fwd(as_rows(x), as_rows(residual), out_dtype), x)

    @staticmethod
    def backward(ctx, grad):
        x_dtype, residual_dtype = ctx.dtypes
        return grad.to(x_dtype), grad.to(residual_dtype), None


def add(x: Tensor, residual: Tensor, *, input_dtype: str, output_dtype: str, compute_dtype: str) -> Tensor:
    """x, residual [..., N] -> [..., N]."""
    expect_dtype(x, input_dtype, "residual input")
    if residual.shape != x.shape:
        raise ValueError(f"{ID}: residual shape {tuple(residual.shape)} must equal the input's {tuple(x.shape)}")
    require_device(ID, x, residual)
    out_dtype = torch_dtype(output_dtype)
    if needs_grad(x, residual):
        return _TritonResidualAdd.apply(x, residual, out_dtype)
    return from_rows(residual_add_fwd(as_rows(x), as_rows(residual), out_dtype), x)



def check_constants(constants: dict) -> None:
    check_fp32_elementwise(ID, constants)


def register(registry) -> None:
    """Register residual.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="residual", cases=ALL_CASES, fn=add, check_constants=check_constants,
                               sources=(residual_add_fwd_kernel, triton_support)))
