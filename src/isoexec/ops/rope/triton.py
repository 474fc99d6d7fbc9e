"""Rotary position embedding as one Triton kernel over the reference's cos/sin table.

The table is `reference.cos_sin_table`: built once per (theta, rotary_dim, max_positions, table_dtype,
device, scaling) on the CPU in float64 (YaRN's frequencies and attention factor included), rounded to
`table_dtype` and cached on the device, so the first (eager) call builds it and later calls, CUDA-graph
captures included, only index it. x is seen as T·H rows of D; program i rotates BLOCK_R of them: each
row loads its token's position and that table row's (cos, sin) and computes in fp32, in the
`rotate_half` layout, x1·cos - x2·sin and x2·cos + x1·sin, each product and difference rounded (fp
contraction is off: no FMA), then rounds once to the output dtype; dims past `rotary_dim` are copied. A
row's bits depend on its own values and position only. It is the arithmetic of `reference.rope`, so the
bits are the reference's wherever both round to nearest (on a GPU; Triton's interpreter truncates fp32
-> bf16).

A position outside [0, max_positions) has no table row: its token comes out NaN (the reference raises,
which would need a host sync).

The backward pass rotates the gradient back by -angle (times the same attention factor): on a GPU by this
kernel over the table with sin negated, elsewhere (and in float64) with ordinary ops; the same bits.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from ..triton_support import cdiv, check_fp32_elementwise, jit, needs_grad, next_power_of_2, require_device, tl, triton_available
from . import reference, scaling as rope_scaling
from .scaling import Yarn

ID = "rope.triton"

# A row's bits do not depend on the tile, so the tile is picked from the head dim for speed alone: 1024
# rotated pairs per program over 4 warps, e.g. 16 heads of 128 dims (Qwen3-0.6B's q heads of a token).
TILE_PAIRS, NUM_WARPS = 1024, 4
FP32_OR_NARROWER = (torch.bfloat16, torch.float16, torch.float32)  # what the kernel computes in fp32 exactly


@jit
def cos_sin(table, b_pos, o_i, m_i, max_positions, stride_ct, stride_ci, stride_cs):
    """The table's fp32 (cos, sin) at positions b_pos and pair indices o_i (broadcast together), masked by m_i;
    NaN for a position outside the table. Shared with the fused q/k launch (`qk_triton.py`)."""
    m_pos = (b_pos >= 0) & (b_pos < max_positions)
    p_c = table + b_pos * stride_ct + o_i * stride_ci
    b_cos = tl.where(m_pos, tl.load(p_c, mask=m_i & m_pos, other=0.0).to(tl.float32), float("nan"))
    b_sin = tl.where(m_pos, tl.load(p_c + stride_cs, mask=m_i & m_pos, other=0.0).to(tl.float32), float("nan"))
    return b_cos, b_sin


@jit
def rotate(b_x1, b_x2, b_cos, b_sin):
    """The rotate_half pair in fp32: x1·cos - x2·sin and x2·cos + x1·sin, each product and sum rounded by itself
    (every launch of it disables FMA contraction)."""
    return b_x1 * b_cos - b_x2 * b_sin, b_x2 * b_cos + b_x1 * b_sin


# One compiled kernel for every number of tokens.
@jit(do_not_specialize=["num_rows"])
def rope_fwd_kernel(
    x, positions, table, y,
    num_rows, max_positions,
    stride_xt, stride_xh, stride_xd, stride_p, stride_ct, stride_ci, stride_cs,
    H: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    o_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # rows t·H + h of [T·H, D]
    o_t, o_h = o_r // H, o_r % H
    o_i = tl.arange(0, BLOCK_HALF)
    m_r, m_i = o_r < num_rows, o_i < HALF
    m_x = m_r[:, None] & m_i[None, :]

    b_pos = tl.load(positions + o_t * stride_p, mask=m_r, other=0).to(tl.int64)  # [BLOCK_R]
    b_cos, b_sin = cos_sin(table, b_pos[:, None], o_i[None, :], m_x, max_positions, stride_ct, stride_ci, stride_cs)  # [BLOCK_R, BLOCK_HALF]

    p_x = x + o_t[:, None] * stride_xt + o_h[:, None] * stride_xh
    p_y = y + o_r[:, None] * D
    b_x1 = tl.load(p_x + o_i[None, :] * stride_xd, mask=m_x, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_HALF]
    b_x2 = tl.load(p_x + (HALF + o_i[None, :]) * stride_xd, mask=m_x, other=0.0).to(tl.float32)
    b_y1, b_y2 = rotate(b_x1, b_x2, b_cos, b_sin)
    tl.store(p_y + o_i[None, :], b_y1.to(y.dtype.element_ty), mask=m_x)
    tl.store(p_y + HALF + o_i[None, :], b_y2.to(y.dtype.element_ty), mask=m_x)

    if D > 2 * HALF:
        o_d = 2 * HALF + tl.arange(0, BLOCK_PASS)
        m_d = m_r[:, None] & (o_d < D)[None, :]
        b_x = tl.load(p_x + o_d[None, :] * stride_xd, mask=m_d)  # [BLOCK_R, BLOCK_PASS]
        tl.store(p_y + o_d[None, :], b_x.to(y.dtype.element_ty), mask=m_d)


def rope_fwd(x: Tensor, positions: Tensor, table: Tensor, out_dtype: torch.dtype) -> Tensor:
    """x [T, H, D], positions [T], table [max_positions, rotary_dim / 2, 2] -> [T, H, D] in `out_dtype` (contiguous)."""
    tokens, heads, head_dim = x.shape
    half = table.shape[1]
    y = x.new_empty((tokens, heads, head_dim), dtype=out_dtype)
    if y.numel() == 0:
        return y
    block_half = next_power_of_2(half)
    block_r = max(1, TILE_PAIRS // block_half)
    rope_fwd_kernel[(cdiv(tokens * heads, block_r),)](
        x, positions, table, y,
        tokens * heads, table.shape[0],
        x.stride(0), x.stride(1), x.stride(2), positions.stride(0), table.stride(0), table.stride(1), table.stride(2),
        H=heads, D=head_dim, HALF=half,
        BLOCK_R=block_r, BLOCK_HALF=block_half, BLOCK_PASS=next_power_of_2(max(1, head_dim - 2 * half)),
        num_warps=NUM_WARPS,
        # the reference rounds each product and each difference; a fused multiply-add would round once
        enable_fp_fusion=False,
    )
    return y


def _rotate_back(grad: Tensor, positions: Tensor, table: Tensor) -> Tensor:
    """The transpose of the rotation: grad [T, H, D] rotated by -angle, pass-through dims copied."""
    dtype = torch.promote_types(grad.dtype, torch.float32)
    entry = table.index_select(0, positions).to(dtype)  # [T, rotary_dim / 2, 2]
    cos, sin = entry[:, None, :, 0], entry[:, None, :, 1]
    half = table.shape[1]
    g = grad.to(dtype)
    g1, g2 = g[..., :half], g[..., half : 2 * half]
    return torch.cat([g1 * cos + g2 * sin, g2 * cos - g1 * sin, g[..., 2 * half :]], dim=-1)


@functools.lru_cache(maxsize=32)
def _back_table(*table_args) -> Tensor:
    """`reference.cos_sin_table(*table_args)` with sin negated: the forward kernel over it rotates by -angle."""
    table = reference.cos_sin_table(*table_args)
    return torch.stack([table[..., 0], -table[..., 1]], dim=-1)


class _TritonRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, table_args, out_dtype):
        ctx.save_for_backward(positions)
        ctx.table_args, ctx.x_dtype = table_args, x.dtype
        return rope_fwd(x, positions, reference.cos_sin_table(*table_args), out_dtype)

    @staticmethod
    def backward(ctx, grad):
        (positions,) = ctx.saved_tensors
        if grad.is_cuda and grad.dtype in FP32_OR_NARROWER:
            # The forward kernel with sin negated computes g1·cos - g2·(-sin) and g2·cos + g1·(-sin):
            # `_rotate_back`'s fp32 products and sums bit for bit (negation is exact), in one launch
            # instead of ten ops' worth of host time.
            return rope_fwd(grad, positions, _back_table(*ctx.table_args), ctx.x_dtype), None, None, None
        return _rotate_back(grad, positions, reference.cos_sin_table(*ctx.table_args)).to(ctx.x_dtype), None, None, None


def rope(x: Tensor, positions: Tensor, theta: float, max_positions: int, rotary_dim: int | None = None, scaling: Yarn | None = None, *,
         input_dtype: str, output_dtype: str, table_dtype: str, compute_dtype: str, table_build: str) -> Tensor:
    """x [T, H, D], positions [T] -> [T, H, D]."""
    expect_dtype(x, input_dtype, "rope input")
    check_constants(dict(input_dtype=input_dtype, output_dtype=output_dtype, table_dtype=table_dtype, compute_dtype=compute_dtype,
                         table_build=table_build))
    if x.dim() != 3:
        raise ValueError(f"{ID}: x must be [T, H, D], got shape {tuple(x.shape)}")
    positions = positions.reshape(-1)
    if positions.shape[0] != x.shape[0]:
        raise ValueError(f"{ID}: {positions.shape[0]} positions for {x.shape[0]} tokens")
    head_dim = x.shape[-1]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if not 0 < rotary_dim <= head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be in 1..{head_dim}")
    require_device(ID, x, positions)
    table_args = (float(theta), rotary_dim, max_positions, table_dtype, str(x.device), scaling)
    out_dtype = torch_dtype(output_dtype)
    if needs_grad(x):
        return _TritonRope.apply(x, positions, table_args, out_dtype)
    return rope_fwd(x, positions, reference.cos_sin_table(*table_args), out_dtype)


def check_constants(constants: dict) -> None:
    if constants["table_build"] != "cpu_float64":
        raise ValueError(f'{ID} indexes the table built on the CPU in float64: table_build must be "cpu_float64", '
                         f'got "{constants["table_build"]}"')
    torch_dtype(constants["table_dtype"])
    check_fp32_elementwise(ID, constants)


def register(registry) -> None:
    """Register rope.triton@1; without Triton installed, nothing is registered. Its sources include the fused
    q/k norm and rotary launch (`qk_triton.py`) the binding offers beside it, which must give its bits."""
    if triton_available():
        from . import qk_triton

        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="rope", cases=ALL_CASES, fn=rope, check_constants=check_constants,
                               sources=(rope_fwd_kernel, cos_sin, rotate, reference, rope_scaling, triton_support, qk_triton)))
