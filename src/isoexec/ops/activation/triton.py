"""SwiGLU activation silu(gate) * up as one Triton kernel, elementwise in fp32 with one rounding.

Program (i_r, i_n) computes a [BLOCK_R, BLOCK_N] tile of the [R, N] rows as the reference writes them:
g / (1 + exp(-g)) from exp, a correctly rounded add and a correctly rounded divide (`div_rn`; Triton's
`/` divides approximately on the GPU), times up, rounded once to the output dtype. An element's bits
depend on its gate and up only, never on the tile or on how many rows share the call.

On the GPU exp is libdevice's `__nv_expf` without flush-to-zero: CUDA's accurate `expf`, the one torch's
exp kernel calls, so the bits are meant to be the reference's (`tl.exp` would be the approximate
`ex2.approx` instruction). Triton's interpreter has no libdevice and uses numpy's exp, whose bits differ
from torch's CPU exp in the last place for some inputs.

The backward pass is one fp32 kernel too (`silu_mul_bwd_kernel`): gradients must be correct, not
batch-invariant.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from ..triton_support import (
    ELEMENTWISE_WARPS, after_upstream, as_rows, check_fp32_elementwise, elementwise_tile, elementwise_tiles, from_rows,
    interpreting, jit, load_fp32, needs_grad, require_device, tl, triton_available,
)

try:
    from triton.language.extra import libdevice
except ImportError:
    libdevice = None

ID = "activation.triton"

@jit
def exp_fp32(b_x, USE_LIBDEVICE: tl.constexpr):
    """exp in fp32: libdevice's accurate one on the GPU (launch with enable_reflect_ftz=False), numpy's in
    the interpreter (module doc)."""
    if USE_LIBDEVICE:
        return libdevice.exp(b_x)
    return tl.exp(b_x)


@jit
def silu_mul_fp32(b_g, b_u, USE_LIBDEVICE: tl.constexpr):
    """g / (1 + exp(-g)) * u of fp32 tiles, the division correctly rounded: this kernel's arithmetic, also
    the epilogue of the MoE experts' gate_up GEMM (ops/moe/experts_triton.py)."""
    return tl.math.div_rn(b_g, 1.0 + exp_fp32(-b_g, USE_LIBDEVICE)) * b_u


# One compiled kernel for every number of rows.
@jit(do_not_specialize=["num_rows"], dependent=True)
def silu_mul_fwd_kernel(
    gate, up, y,
    num_rows,
    stride_gr, stride_gn, stride_ur, stride_un,
    N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_LIBDEVICE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    after_upstream(PDL)
    o_r, o_n, m = elementwise_tile(num_rows, N, BLOCK_R, BLOCK_N)
    b_g = load_fp32(gate, o_r, o_n, m, stride_gr, stride_gn)  # [BLOCK_R, BLOCK_N]
    b_u = load_fp32(up, o_r, o_n, m, stride_ur, stride_un)
    b_y = silu_mul_fp32(b_g, b_u, USE_LIBDEVICE)
    tl.store(y + o_r[:, None] * N + o_n[None, :], b_y.to(y.dtype.element_ty), mask=m)


def silu_mul_fwd(gate: Tensor, up: Tensor, out_dtype: torch.dtype) -> Tensor:
    """gate, up [R, N] -> [R, N] in `out_dtype` (contiguous)."""
    rows, width = gate.shape
    y = gate.new_empty((rows, width), dtype=out_dtype)
    if rows == 0 or width == 0:
        return y
    grid, block_r, block_n = elementwise_tiles(rows, width)
    silu_mul_fwd_kernel[grid](
        gate, up, y,
        rows,
        gate.stride(0), gate.stride(1), up.stride(0), up.stride(1),
        N=width, BLOCK_R=block_r, BLOCK_N=block_n, USE_LIBDEVICE=not interpreting(),
        num_warps=ELEMENTWISE_WARPS,
        # libdevice's exp without flush-to-zero, as CUDA's expf is compiled by default
        enable_reflect_ftz=False,
    )
    return y


@jit(do_not_specialize=["num_rows"])
def silu_mul_bwd_kernel(
    gate, up, dy, d_gate, d_up,
    num_rows,
    stride_gr, stride_gn, stride_ur, stride_un, stride_dr, stride_dn,
    N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """d_gate = dy u s (1 + g (1 - s)), d_up = dy g s with s = sigmoid(g), in fp32 (correct, not invariant)."""
    o_r, o_n, m = elementwise_tile(num_rows, N, BLOCK_R, BLOCK_N)
    b_g = load_fp32(gate, o_r, o_n, m, stride_gr, stride_gn)
    b_u = load_fp32(up, o_r, o_n, m, stride_ur, stride_un)
    b_dy = load_fp32(dy, o_r, o_n, m, stride_dr, stride_dn)
    b_s = tl.sigmoid(b_g)
    p = o_r[:, None] * N + o_n[None, :]
    tl.store(d_gate + p, (b_dy * b_u * b_s * (1.0 + b_g * (1.0 - b_s))).to(d_gate.dtype.element_ty), mask=m)
    tl.store(d_up + p, (b_dy * b_g * b_s).to(d_up.dtype.element_ty), mask=m)


def silu_mul_bwd(gate: Tensor, up: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """gate, up, grad [R, N] -> (grad_gate, grad_up) [R, N] in the inputs' dtypes."""
    rows, width = gate.shape
    d_gate, d_up = torch.empty_like(gate, memory_format=torch.contiguous_format), torch.empty_like(up, memory_format=torch.contiguous_format)
    if rows == 0 or width == 0:
        return d_gate, d_up
    grid, block_r, block_n = elementwise_tiles(rows, width)
    silu_mul_bwd_kernel[grid](
        gate, up, grad, d_gate, d_up,
        rows,
        gate.stride(0), gate.stride(1), up.stride(0), up.stride(1), grad.stride(0), grad.stride(1),
        N=width, BLOCK_R=block_r, BLOCK_N=block_n,
        num_warps=ELEMENTWISE_WARPS,
    )
    return d_gate, d_up


class _TritonSiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, out_dtype):
        ctx.save_for_backward(gate, up)
        return from_rows(silu_mul_fwd(as_rows(gate), as_rows(up), out_dtype), gate)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        grad_gate, grad_up = silu_mul_bwd(as_rows(gate), as_rows(up), as_rows(grad))
        return from_rows(grad_gate, gate), from_rows(grad_up, up), None


def silu_mul(gate: Tensor, up: Tensor, *, input_dtype: str, output_dtype: str, compute_dtype: str) -> Tensor:
    """gate, up [..., I] -> [..., I]."""
    expect_dtype(gate, input_dtype, "activation gate")
    if up.shape != gate.shape:
        raise ValueError(f"{ID}: up shape {tuple(up.shape)} must equal the gate's {tuple(gate.shape)}")
    require_device(ID, gate, up)
    out_dtype = torch_dtype(output_dtype)
    if needs_grad(gate, up):
        return _TritonSiluMul.apply(gate, up, out_dtype)
    return from_rows(silu_mul_fwd(as_rows(gate), as_rows(up), out_dtype), gate)



def check_constants(constants: dict) -> None:
    check_fp32_elementwise(ID, constants)


def register(registry) -> None:
    """Register activation.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="activation", cases=ALL_CASES, fn=silu_mul, check_constants=check_constants,
                               sources=(silu_mul_fwd_kernel, silu_mul_fp32, exp_fp32, triton_support)))
