"""q/k RMSNorm, rotary embedding and the paged-cache write of k and v as one Triton launch.

An attention layer's decode step otherwise launches six small kernels between its q/k/v projection and
its attention: `rms_norm.triton` over q's heads and over k's, `rope.triton` over each, and two cache
writes. At batch 1 each is a few microseconds of a step that the weights' bytes would let run in a few
hundred (Qwen3-0.6B: 6 of its ~14 launches a layer). This launch gives each output the bits those calls
give, so it is not a contract op: `runtime/binding.py` offers it to a case whose contract pins q_norm and
k_norm to `rms_norm.triton` (with one set of constants) and rotary_emb to `rope.triton`, and the layer
calls it where it can (`model/layers/attention.py`), the separate ops elsewhere.

Program (t, h) takes token t's head h: a q head, a k head, or a v head (copied to the cache unchanged).
A q or k row's sum of squares is `rms_norm.triton`'s (`inv_rms`: the same code, one row per program over
the contract's chunks and warps, so the same reduction tree). Both are compiled without FMA contraction, so
that sum ends the same in every thread and the elementwise rest may lay the row out otherwise: each element
normalised (`normed`) and rounded to the norm's output dtype, then rotated by `rope.triton`'s own helpers
(`cos_sin`, `rotate`: x1·cos - x2·sin and x2·cos + x1·sin, each product and sum rounded by itself). Partial rotary passes the normalised
dims past `rotary_dim` through. A k row and its v row go to the cache slot the token writes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..rms_norm.triton import inv_rms, normed
from ..triton_support import after_upstream, cdiv, jit, needs_grad, next_power_of_2, require_device, tl
from . import reference
from .triton import cos_sin, rotate


@jit
def _normed_half(p_x, p_w, o, m, b_r, HAS_NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """Elements o of the row, normalised and rounded as the norm's output (the x dtype), back in fp32."""
    b_x = tl.load(p_x + o, mask=m, other=0.0)
    if HAS_NORM:
        b_x = normed(b_x.to(tl.float32), tl.load(p_w + o, mask=m, other=0.0), b_r, ZERO_CENTERED).to(p_x.dtype.element_ty)
    return b_x


@jit
def _norm_rotate_row(
    p_x, p_y, p_w, i_t, positions, table, max_positions, eps, stride_p, stride_ct, stride_ci, stride_cs,
    D: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr, HAS_NORM: tl.constexpr,
    ZERO_CENTERED: tl.constexpr, NH: tl.constexpr, REDUCE_BLOCK: tl.constexpr,
):
    """One q or k row: normalised as rms_norm.triton, rotated as rope.triton, stored at p_y."""
    b_r = 0.0
    if HAS_NORM:
        b_r = inv_rms(p_x, p_x, p_x, 1, 1, 1, eps, D, NH, False, REDUCE_BLOCK)
    o_i = tl.arange(0, BLOCK_HALF)
    m_i = o_i < HALF
    b_pos = tl.load(positions + i_t * stride_p).to(tl.int64)
    b_cos, b_sin = cos_sin(table, b_pos, o_i, m_i, max_positions, stride_ct, stride_ci, stride_cs)
    b_x1 = _normed_half(p_x, p_w, o_i, m_i, b_r, HAS_NORM, ZERO_CENTERED).to(tl.float32)
    b_x2 = _normed_half(p_x, p_w, HALF + o_i, m_i, b_r, HAS_NORM, ZERO_CENTERED).to(tl.float32)
    y1, y2 = rotate(b_x1, b_x2, b_cos, b_sin)
    tl.store(p_y + o_i, y1.to(p_y.dtype.element_ty), mask=m_i)
    tl.store(p_y + HALF + o_i, y2.to(p_y.dtype.element_ty), mask=m_i)
    if D > 2 * HALF:
        o_d = 2 * HALF + tl.arange(0, BLOCK_PASS)
        m_d = o_d < D
        tl.store(p_y + o_d, _normed_half(p_x, p_w, o_d, m_d, b_r, HAS_NORM, ZERO_CENTERED).to(p_y.dtype.element_ty), mask=m_d)


@jit(do_not_specialize=["num_tokens"], dependent=True)
def qk_norm_rope_kernel(
    q, k, v, q_out, k_out, v_out, write_slots, positions, table, q_w, k_w,
    num_tokens, max_positions, eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_vot, stride_voh,
    stride_p, stride_ct, stride_ci, stride_cs,
    H: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    NH: tl.constexpr,
    REDUCE_BLOCK: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    after_upstream(PDL)
    i_t, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    row = i_t
    if HAS_SLOTS:
        row = tl.load(write_slots + i_t).to(tl.int64)
    if i_h < H:
        _norm_rotate_row(q + i_t * stride_qt + i_h * stride_qh, q_out + i_t * stride_qot + i_h * stride_qoh, q_w, i_t, positions, table,
                         max_positions, eps, stride_p, stride_ct, stride_ci, stride_cs,
                         D, HALF, BLOCK_HALF, BLOCK_PASS, HAS_NORM, ZERO_CENTERED, NH, REDUCE_BLOCK)
    elif i_h < H + HKV:
        i_k = i_h - H
        _norm_rotate_row(k + i_t * stride_kt + i_k * stride_kh, k_out + row * stride_kot + i_k * stride_koh, k_w, i_t, positions, table,
                         max_positions, eps, stride_p, stride_ct, stride_ci, stride_cs,
                         D, HALF, BLOCK_HALF, BLOCK_PASS, HAS_NORM, ZERO_CENTERED, NH, REDUCE_BLOCK)
    else:  # a v head: to the cache as it is
        i_v = i_h - H - HKV
        o_d = tl.arange(0, BLOCK_D)
        b_v = tl.load(v + i_t * stride_vt + i_v * stride_vh + o_d, mask=o_d < D)
        tl.store(v_out + row * stride_vot + i_v * stride_voh + o_d, b_v.to(v_out.dtype.element_ty), mask=o_d < D)


def qk_norm_rope(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, norm_weights: tuple[Tensor, Tensor] | None, eps: float,
                 zero_centered: bool, theta: float, max_positions: int, rotary_dim: int | None, cache: tuple[Tensor, Tensor, Tensor] | None,
                 *, norm: dict | None, rope: dict) -> tuple[Tensor, Tensor, Tensor] | None:
    """q [T, H, D], k and v [T, Hkv, D] -> (q', k', v): q and k normalised with `norm_weights` (q's, k's;
    None: no q/k norm) and rotated by `positions`; with `cache` = (k store, v store, write slots) k' and v
    are written to the store rows the tokens own and the stores come back in their place. `norm` and `rope`
    are the constants `rms_norm.triton` and `rope.triton` are bound with (`norm` None: q_norm and k_norm not
    pinned to `rms_norm.triton`).

    None where this launch would not give those calls' bits or cannot run: autograd, a norm asked for without
    `rms_norm.triton`'s constants, dtypes the calls would convert, heads not contiguous in their last dim. The
    caller then runs the separate ops."""
    if norm_weights is not None and norm is None:
        return None
    if needs_grad(q, k, v, *(norm_weights or ())):
        return None
    dtype = q.dtype
    head_dim = q.shape[-1]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    out_dtypes = {rope["input_dtype"], rope["output_dtype"]} | ({norm["input_dtype"], norm["output_dtype"]} if norm else set())
    if out_dtypes != {str(dtype).removeprefix("torch.")} or k.dtype != dtype or v.dtype != dtype:
        return None
    if rope["table_build"] != "cpu_float64" or rope["compute_dtype"] != "float32" or not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        return None
    if any(t.stride(-1) != 1 for t in (q, k, v)) or (cache is not None and any(t.dtype != dtype or t.stride(-1) != 1 for t in cache[:2])):
        return None
    require_device("rope.triton", q, k, v)
    tokens, heads, _ = q.shape
    kv_heads = k.shape[1]
    table = reference.cos_sin_table(float(theta), rotary_dim, max_positions, rope["table_dtype"], str(q.device), None)
    q_out = torch.empty((tokens, heads, head_dim), dtype=dtype, device=q.device)
    if cache is None:
        # no v programs run, and `slots` is never read (any pointer will do)
        k_out, v_out, slots = torch.empty((tokens, kv_heads, head_dim), dtype=dtype, device=q.device), v, positions
    else:
        k_out, v_out, slots = cache
    if tokens == 0:
        return q_out, k_out, v_out
    q_w, k_w = norm_weights if norm_weights is not None else (q, q)  # not read without a norm
    has_norm = norm_weights is not None
    reduce_block = norm["reduce_block"] if has_norm else 16
    half = rotary_dim // 2
    qk_norm_rope_kernel[(tokens, heads + kv_heads + (kv_heads if cache is not None else 0))](
        q, k, v, q_out, k_out, v_out, slots, positions, table, q_w, k_w,
        tokens, table.shape[0], float(eps),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), v_out.stride(0), v_out.stride(1),
        positions.stride(0), table.stride(0), table.stride(1), table.stride(2),
        H=heads, HKV=kv_heads, D=head_dim, BLOCK_D=next_power_of_2(head_dim), HALF=half, BLOCK_HALF=next_power_of_2(half),
        BLOCK_PASS=next_power_of_2(max(1, head_dim - 2 * half)), HAS_NORM=has_norm, ZERO_CENTERED=bool(zero_centered),
        NH=cdiv(head_dim, reduce_block), REDUCE_BLOCK=reduce_block, HAS_SLOTS=cache is not None,
        num_warps=norm["num_warps"] if has_norm else 1,
        enable_fp_fusion=False,  # as rms_norm.triton and rope.triton are compiled
    )
    return q_out, k_out, v_out
