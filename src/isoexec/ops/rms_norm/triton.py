"""Batch-invariant RMSNorm as one Triton program per row.

Row r, in fp32: the hidden dim is walked in ascending chunks of REDUCE_BLOCK; each chunk's squares are
reduced by one `tl.sum` (its in-chunk tree is fixed by REDUCE_BLOCK and num_warps) and added to a
running scalar; the sum divided by H, eps added, square root and reciprocal correctly rounded; then
x · r · w (or · (1 + w)) chunk by chunk, rounded once to the output dtype. Padding lanes of the last
chunk load +0.0, which adds nothing. The row never meets another row, and the launch depends on the
number of rows only through the grid. H is a compile-time constant (see `ops/linear/triton.py`).

The backward pass uses ordinary ops: gradients must be correct, not batch-invariant.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from ..triton_support import jit, needs_grad, require_device, tl, triton, triton_available

ID = "rms_norm.triton"
BOUNDARY_DTYPES = ("bfloat16", "float16", "float32")

# Hopper (H100/H200) constants, keyed by the hidden size H, not swept. One contract entry covers every
# norm of the model, head-dim q_norm/k_norm included, so an entry takes the value for its widest H.
# A chunk of 1024 over 4 warps gives each thread 8 contiguous elements (16-byte bf16 loads); on one
# H200 a [4096, 4096] bf16 batch took 25 us, torch's fused rms_norm 27 us.
HOPPER_CONSTANTS = {
    64: dict(reduce_block=64, num_warps=1),  # tiny-dense hidden (and head_dim 16)
    128: dict(reduce_block=128, num_warps=1),  # Qwen3-8B q_norm, k_norm (head_dim 128)
    1024: dict(reduce_block=1024, num_warps=4),  # Qwen3-0.6B hidden (not timed; as Qwen3-8B's)
    4096: dict(reduce_block=1024, num_warps=4),  # Qwen3-8B hidden
}


@jit
def rms_norm_fwd_kernel(
    x, w, y,
    stride_xr, stride_xh, stride_yr, stride_yh,
    eps,
    H: tl.constexpr,
    NH: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    REDUCE_BLOCK: tl.constexpr,
):
    i_r = tl.program_id(0).to(tl.int64)
    p_x = x + i_r * stride_xr
    p_y = y + i_r * stride_yr

    b_sum = tl.full([], 0.0, dtype=tl.float32)
    for i_h in range(0, NH):
        o_h = i_h * REDUCE_BLOCK + tl.arange(0, REDUCE_BLOCK)
        m_h = o_h < H
        b_x = tl.load(p_x + o_h * stride_xh, mask=m_h, other=0.0).to(tl.float32)  # [REDUCE_BLOCK]
        b_sum += tl.sum(b_x * b_x, axis=0)
    b_r = tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(b_sum, H * 1.0) + eps))

    for i_h in range(0, NH):
        o_h = i_h * REDUCE_BLOCK + tl.arange(0, REDUCE_BLOCK)
        m_h = o_h < H
        b_x = tl.load(p_x + o_h * stride_xh, mask=m_h, other=0.0).to(tl.float32)
        b_w = tl.load(w + o_h, mask=m_h, other=0.0).to(tl.float32)
        if ZERO_CENTERED:
            b_w = 1.0 + b_w
        b_y = (b_x * b_r) * b_w
        tl.store(p_y + o_h * stride_yh, b_y.to(y.dtype.element_ty), mask=m_h)


def rms_norm_fwd(x: Tensor, weight: Tensor, eps: float, zero_centered: bool, out_dtype: torch.dtype, *, reduce_block: int,
                 num_warps: int) -> Tensor:
    """x [R, H], weight [H] -> [R, H] in `out_dtype`."""
    rows, hidden = x.shape
    y = x.new_empty((rows, hidden), dtype=out_dtype)
    if rows == 0 or hidden == 0:
        return y
    rms_norm_fwd_kernel[(rows,)](
        x, weight.contiguous(), y,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        float(eps),
        H=hidden, NH=triton.cdiv(hidden, reduce_block), ZERO_CENTERED=bool(zero_centered), REDUCE_BLOCK=reduce_block,
        num_warps=num_warps,
    )
    return y


class _TritonRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, zero_centered, out_dtype, config):
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.zero_centered = eps, zero_centered
        y = rms_norm_fwd(x.reshape(-1, x.shape[-1]), weight, eps, zero_centered, out_dtype, **config)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dtype = torch.promote_types(x.dtype, torch.float32)
        xf, g = x.to(dtype), grad.to(dtype)
        scale = weight.to(dtype) + (1.0 if ctx.zero_centered else 0.0)
        r = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + ctx.eps)  # [..., 1]
        gs = g * scale
        grad_x = r * gs - xf * r.pow(3) * (gs * xf).mean(-1, keepdim=True)
        grad_w = (g * xf * r).reshape(-1, x.shape[-1]).sum(0)
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None, None, None, None


def rms_norm(x: Tensor, weight: Tensor, eps: float, zero_centered: bool = False, *, input_dtype: str, output_dtype: str,
             accum_dtype: str, reduce_block: int, num_warps: int) -> Tensor:
    """x [..., H], weight [H] -> [..., H]."""
    expect_dtype(x, input_dtype, "rms_norm input")
    require_device(ID, x, weight)
    config = dict(reduce_block=reduce_block, num_warps=num_warps)
    if needs_grad(x, weight):
        return _TritonRMSNorm.apply(x, weight, eps, zero_centered, torch_dtype(output_dtype), config)
    return rms_norm_fwd(x.reshape(-1, x.shape[-1]), weight, eps, zero_centered, torch_dtype(output_dtype), **config).reshape(x.shape)


def check_constants(constants: dict) -> None:
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    for name in ("input_dtype", "output_dtype"):
        if constants[name] not in BOUNDARY_DTYPES:
            raise ValueError(f"{ID}: {name} must be one of {', '.join(BOUNDARY_DTYPES)}")
    block = constants["reduce_block"]
    if block & (block - 1):
        raise ValueError(f"{ID}: reduce_block must be a power of two (a tl.arange length), got {block}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"{ID}: num_warps must be a power of two <= 32")


def register(registry) -> None:
    """Register rms_norm.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(id=ID, version=1, region="rms_norm", cases=ALL_CASES, fn=rms_norm, check_constants=check_constants,
                               sources=(rms_norm_fwd_kernel, triton_support)))
