"""Batch-invariant RMSNorm as one Triton program per row, optionally fused with the residual add before it.

Row r, in fp32: the hidden dim is walked in ascending chunks of REDUCE_BLOCK; each chunk's squares are
rounded and reduced by one `tl.sum` (its in-chunk tree is fixed by REDUCE_BLOCK and num_warps; compiled
without FMA contraction, so every thread ends with the same sum) and added to a running scalar; the sum
divided by H, eps added, square root and reciprocal correctly rounded; then x · r · w (or · (1 + w))
chunk by chunk, rounded once to the output dtype. Padding lanes of the last chunk load +0.0, which adds
nothing. The row never meets another row, and the launch depends on the number of rows only through the
grid. H is a compile-time constant (see `ops/linear/triton.py`).

With HAS_RESIDUAL (`rms_norm.residual.triton`) the row normalised is s = x + residual: each chunk adds
the two in fp32 and rounds once to the output dtype, as `residual.triton` does, then widens those bits
to fp32 exactly as it widens a loaded x. Pass 1 also stores s; pass 2 recomputes it the same way
instead of reloading it. So the fused call gives the bits of `residual.triton` then `rms_norm.triton`
with the same constants, without the add's store and the norm's load of s in between.

The backward pass is one kernel over whole rows in fp32 (`rms_norm_bwd_kernel`) and a sum of its
per-program weight-gradient partials: gradients must be correct, not batch-invariant. As eager torch
ops it was ~15 launches per norm, a third of a training step's launches (docs/experiments.md).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, expect_dtype, torch_dtype
from . import tuning
from ..triton_support import after_upstream, as_rows, cdiv, from_rows, jit, needs_grad, next_power_of_2, require_device, tl, triton_available

ID = "rms_norm.triton"
RESIDUAL_ID = "rms_norm.residual.triton"
BOUNDARY_DTYPES = ("bfloat16", "float16", "float32")

@jit
def row_chunk(p_x, p_r, p_s, o_h, m_h, stride_xh, stride_rh, HAS_RESIDUAL: tl.constexpr):
    """The chunk `o_h` of the row to normalise, as memory would hold it: x, or x + residual added in
    fp32 and rounded once to s's dtype (`residual.triton`'s arithmetic)."""
    b_x = tl.load(p_x + o_h * stride_xh, mask=m_h, other=0.0)  # [REDUCE_BLOCK]
    if HAS_RESIDUAL:
        b_r = tl.load(p_r + o_h * stride_rh, mask=m_h, other=0.0)
        b_x = (b_x.to(tl.float32) + b_r.to(tl.float32)).to(p_s.dtype.element_ty)
    return b_x


@jit
def inv_rms(p_x, p_r, p_s, stride_xh, stride_rh, stride_yh, eps, H: tl.constexpr, NH: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
            REDUCE_BLOCK: tl.constexpr):
    """Pass 1 over one row: 1 / sqrt(sum of squares / H + eps), the squares summed chunk by chunk in
    ascending order; with a residual, each chunk of s is stored on the way. Shared with the fused q/k
    norm and rotary launch (`ops/rope/qk_triton.py`), which must give a norm's bits."""
    b_sum = tl.full([], 0.0, dtype=tl.float32)
    for i_h in range(0, NH):
        o_h = i_h * REDUCE_BLOCK + tl.arange(0, REDUCE_BLOCK)
        m_h = o_h < H
        b_x = row_chunk(p_x, p_r, p_s, o_h, m_h, stride_xh, stride_rh, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            tl.store(p_s + o_h * stride_yh, b_x, mask=m_h)
        b_x = b_x.to(tl.float32)
        b_sum += tl.sum(b_x * b_x, axis=0)
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(tl.math.div_rn(b_sum, H * 1.0) + eps))


@jit
def normed(b_x, b_w, b_r, ZERO_CENTERED: tl.constexpr):
    """Pass 2, elementwise: x · r · w (or · (1 + w)) in fp32, x already fp32."""
    b_w = b_w.to(tl.float32)
    if ZERO_CENTERED:
        b_w = 1.0 + b_w
    return (b_x * b_r) * b_w


@jit(dependent=True)
def rms_norm_fwd_kernel(
    x, r, w, y, s,
    stride_xr, stride_xh, stride_rr, stride_rh, stride_yr, stride_yh,
    eps,
    H: tl.constexpr,
    NH: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    REDUCE_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    after_upstream(PDL)
    i_r = tl.program_id(0).to(tl.int64)
    p_x = x + i_r * stride_xr
    p_r = r + i_r * stride_rr
    p_y = y + i_r * stride_yr
    p_s = s + i_r * stride_yr  # s is laid out as y

    b_r = inv_rms(p_x, p_r, p_s, stride_xh, stride_rh, stride_yh, eps, H, NH, HAS_RESIDUAL, REDUCE_BLOCK)
    for i_h in range(0, NH):
        o_h = i_h * REDUCE_BLOCK + tl.arange(0, REDUCE_BLOCK)
        m_h = o_h < H
        b_x = row_chunk(p_x, p_r, p_s, o_h, m_h, stride_xh, stride_rh, HAS_RESIDUAL).to(tl.float32)
        b_y = normed(b_x, tl.load(w + o_h, mask=m_h, other=0.0), b_r, ZERO_CENTERED)
        tl.store(p_y + o_h * stride_yh, b_y.to(y.dtype.element_ty), mask=m_h)


def rms_norm_fwd(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, zero_centered: bool, out_dtype: torch.dtype, *,
                 reduce_block: int, num_warps: int) -> tuple[Tensor, Tensor]:
    """x [R, H], residual [R, H] or None, weight [H] -> (y, s) [R, H] in `out_dtype`, where s = x + residual
    (x itself without a residual) and y = rms_norm(s)."""
    rows, hidden = x.shape
    y = x.new_empty((rows, hidden), dtype=out_dtype)
    s = x if residual is None else torch.empty_like(y)
    if rows == 0 or hidden == 0:
        return y, s
    r = x if residual is None else residual  # not read without a residual
    rms_norm_fwd_kernel[(rows,)](
        x, r, weight.contiguous(), y, s,
        x.stride(0), x.stride(1), r.stride(0), r.stride(1), y.stride(0), y.stride(1),
        float(eps),
        H=hidden, NH=cdiv(hidden, reduce_block), HAS_RESIDUAL=residual is not None, ZERO_CENTERED=bool(zero_centered),
        REDUCE_BLOCK=reduce_block,
        num_warps=num_warps,
        # No FMA contraction: contracted, a lane adds its own square unrounded to its partner's rounded one in the
        # first shuffle of the sum, so lanes end with sums (and normalised elements) one ulp apart, and which
        # element takes which lane's value would depend on the layout.
        enable_fp_fusion=False,
    )
    return y, s


@jit(do_not_specialize=["num_rows"])
def rms_norm_bwd_kernel(
    x, w, g, e, dx, dw,
    num_rows,
    stride_xr, stride_xh, stride_gr, stride_gh, stride_er, stride_eh, stride_dxr,
    eps,
    H: tl.constexpr,
    H_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
):
    """Program i_p: rows [i_p ROWS, (i_p + 1) ROWS) whole, in fp32: dx = r (g w') - x r³ mean(g w' x) (+ e),
    and the rows' sum of g x r into dw[i_p] (summed over programs by the caller)."""
    i_p = tl.program_id(0)
    o_h = tl.arange(0, H_PAD)
    m_h = o_h < H
    b_w = tl.load(w + o_h, mask=m_h, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        b_w = 1.0 + b_w
    b_dw = tl.zeros([H_PAD], dtype=tl.float32)
    for i in range(ROWS):
        i_r = (i_p * ROWS + i).to(tl.int64)
        m = m_h & (i_r < num_rows)
        b_x = tl.load(x + i_r * stride_xr + o_h * stride_xh, mask=m, other=0.0).to(tl.float32)
        b_g = tl.load(g + i_r * stride_gr + o_h * stride_gh, mask=m, other=0.0).to(tl.float32)
        b_r = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=0) / H + eps)
        b_gw = b_g * b_w
        b_dx = b_r * b_gw - b_x * (b_r * b_r * b_r) * (tl.sum(b_gw * b_x, axis=0) / H)
        if HAS_EXTRA:
            b_dx += tl.load(e + i_r * stride_er + o_h * stride_eh, mask=m, other=0.0).to(tl.float32)
        tl.store(dx + i_r * stride_dxr + o_h, b_dx.to(dx.dtype.element_ty), mask=m)
        b_dw += b_g * b_x * b_r
    tl.store(dw + i_p * H + o_h, b_dw, mask=m_h)


def _rms_norm_backward(x: Tensor, weight: Tensor, grad: Tensor, eps: float, zero_centered: bool,
                       extra: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The gradients of rms_norm(x, weight) for the output gradient `grad`, plus `extra` on grad_x: grad_x
    (in x's dtype) and grad_w, by one kernel over whole rows and a sum of its per-program weight partials.
    Gradients must be correct, not invariant: rows are split among programs by count."""
    hidden = x.shape[-1]
    x2, g2 = as_rows(x), as_rows(grad)
    e2 = as_rows(extra) if extra is not None else g2
    rows = x2.shape[0]
    grad_x = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    rows_per_program = next_power_of_2(cdiv(max(rows, 1), 1024))
    num_programs = cdiv(max(rows, 1), rows_per_program)
    partial = torch.empty((num_programs, hidden), dtype=torch.float32, device=x.device)
    h_pad = next_power_of_2(hidden)
    rms_norm_bwd_kernel[(num_programs,)](
        x2, weight.contiguous(), g2, e2, grad_x, partial,
        rows,
        x2.stride(0), x2.stride(1), g2.stride(0), g2.stride(1), e2.stride(0), e2.stride(1), grad_x.stride(0),
        float(eps),
        H=hidden, H_PAD=h_pad, ROWS=rows_per_program, HAS_EXTRA=extra is not None, ZERO_CENTERED=bool(zero_centered),
        num_warps=min(16, max(1, h_pad // 256)),
    )
    return from_rows(grad_x, x), partial.sum(0).to(weight.dtype)


class _TritonRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, zero_centered, out_dtype, config):
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.zero_centered = eps, zero_centered
        y, _ = rms_norm_fwd(as_rows(x), None, weight, eps, zero_centered, out_dtype, **config)
        return from_rows(y, x)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x, grad_w = _rms_norm_backward(x, weight, grad, ctx.eps, ctx.zero_centered)
        return grad_x, grad_w, None, None, None, None


class _TritonRMSNormResidual(torch.autograd.Function):
    """(x, residual) -> (y, s): s reaches the loss directly and through y, and x and residual both get its gradient."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, zero_centered, out_dtype, config):
        y, s = rms_norm_fwd(as_rows(x), as_rows(residual), weight, eps, zero_centered, out_dtype, **config)
        y, s = from_rows(y, x), from_rows(s, x)
        ctx.save_for_backward(s, weight)
        ctx.eps, ctx.zero_centered, ctx.dtypes = eps, zero_centered, (x.dtype, residual.dtype)
        return y, s

    @staticmethod
    def backward(ctx, grad_y, grad_s):
        s, weight = ctx.saved_tensors
        grad, grad_w = _rms_norm_backward(s, weight, grad_y, ctx.eps, ctx.zero_centered, extra=grad_s)
        x_dtype, residual_dtype = ctx.dtypes
        return grad.to(x_dtype), grad.to(residual_dtype), grad_w, None, None, None, None


def rms_norm(x: Tensor, weight: Tensor, eps: float, zero_centered: bool = False, *, input_dtype: str, output_dtype: str,
             accum_dtype: str, reduce_block: int, num_warps: int) -> Tensor:
    """x [..., H], weight [H] -> [..., H]."""
    expect_dtype(x, input_dtype, "rms_norm input")
    require_device(ID, x, weight)
    config = dict(reduce_block=reduce_block, num_warps=num_warps)
    if needs_grad(x, weight):
        return _TritonRMSNorm.apply(x, weight, eps, zero_centered, torch_dtype(output_dtype), config)
    y, _ = rms_norm_fwd(as_rows(x), None, weight, eps, zero_centered, torch_dtype(output_dtype), **config)
    return from_rows(y, x)


def rms_norm_residual(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, zero_centered: bool = False, *,
                      input_dtype: str, output_dtype: str, accum_dtype: str, reduce_block: int, num_warps: int) -> tuple[Tensor, Tensor]:
    """x, residual [..., H] (None: nothing to add yet, s is x itself), weight [H] -> (y, s) [..., H]."""
    config = dict(reduce_block=reduce_block, num_warps=num_warps)
    if residual is None:
        y = rms_norm(x, weight, eps, zero_centered, input_dtype=input_dtype, output_dtype=output_dtype, accum_dtype=accum_dtype, **config)
        return y, x
    expect_dtype(x, input_dtype, "rms_norm input")
    if residual.shape != x.shape:
        raise ValueError(f"{RESIDUAL_ID}: residual shape {tuple(residual.shape)} must equal the input's {tuple(x.shape)}")
    require_device(RESIDUAL_ID, x, residual, weight)
    if needs_grad(x, residual, weight):
        return _TritonRMSNormResidual.apply(x, residual, weight, eps, zero_centered, torch_dtype(output_dtype), config)
    y, s = rms_norm_fwd(as_rows(x), as_rows(residual), weight, eps, zero_centered, torch_dtype(output_dtype), **config)
    return from_rows(y, x), from_rows(s, x)


def check_constants(constants: dict, impl_id: str = ID) -> None:
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{impl_id} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    for name in ("input_dtype", "output_dtype"):
        if constants[name] not in BOUNDARY_DTYPES:
            raise ValueError(f"{impl_id}: {name} must be one of {', '.join(BOUNDARY_DTYPES)}")
    block = constants["reduce_block"]
    if block & (block - 1):
        raise ValueError(f"{impl_id}: reduce_block must be a power of two (a tl.arange length), got {block}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"{impl_id}: num_warps must be a power of two <= 32")


def register(registry) -> None:
    """Register rms_norm.triton@1 and rms_norm.residual.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="rms_norm", cases=ALL_CASES, fn=rms_norm, check_constants=check_constants, tune=tuning.fit,
                               sources=(rms_norm_fwd_kernel, inv_rms, normed, row_chunk, triton_support)))
        registry.register(Impl(gpu_kernels=True, id=RESIDUAL_ID, version=1, region="rms_norm.residual", cases=ALL_CASES, fn=rms_norm_residual,
                               check_constants=functools.partial(check_constants, impl_id=RESIDUAL_ID), tune=tuning.fit,
                               sources=(rms_norm_fwd_kernel, inv_rms, normed, row_chunk, triton_support)))
