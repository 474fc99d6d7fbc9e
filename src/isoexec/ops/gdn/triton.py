"""gdn.core by chunk-form rows as one Triton kernel: every row from its absolute chunk's start state and
the chunk's earlier rows, by one op sequence in training, prefill chunks and decode (README.md).

One program per (token, value head) looks at its token and, if a run starts there (a new sequence or
slot, or a position that does not follow the previous token's), walks that run chunk piece by chunk
piece for its head. Every tile has C rows, row r holding the chunk's offset r, whichever of them the
piece computes: a decode step is row r of the same tiles as the trainer's, the rows it does not compute
masked to +0.0 (earlier rows come from the sequence's cache slot, later ones do not exist). The matrix
products (k·kᵀ, q·kᵀ, w S₀, q S₀, scores · δ, kᵀ δ) are `tl.dot`s of those fixed tiles; the in-chunk
decay cumsum and the forward substitution are serial over the piece's rows, each row's sums over the C
rows of the chunk. Nothing waits on the host. The backward pass recomputes the forward with `native`
(the chunk form in torch) under autograd: correct gradients, not invariant ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, torch_dtype
from ..triton_support import jit, needs_grad, require_device, tl, triton, triton_available
from . import native
from .reference import L2_EPS as _L2_EPS
from .reference import SOFTPLUS_THRESHOLD as _SOFTPLUS_THRESHOLD
from .reference import check_inputs

ID = "gdn.core.triton"
# The reference's constants, as constexprs a kernel may read.
L2_EPS = tl.constexpr(_L2_EPS) if tl is not None else _L2_EPS
SOFTPLUS_THRESHOLD = tl.constexpr(_SOFTPLUS_THRESHOLD) if tl is not None else _SOFTPLUS_THRESHOLD
DTYPES = ("bfloat16", "float32")


@jit
def _row_of(x, rows, r):
    """Row r of a [C, N] tile (a [N] vector), by a masked sum: a register tile has no dynamic index."""
    return tl.sum(tl.where(rows[:, None] == r, x, 0.0), 0)


@jit
def _at(x, rows, r):
    """Element r of a [C] vector."""
    return tl.sum(tl.where(rows == r, x, 0.0), 0)


@jit
def _dot(a, b, DOT_IN_FP32: tl.constexpr):
    if DOT_IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")


# T and has_cache are not specialised: one compiled kernel serves every case (a trainer call without a
# cache and an engine call with one compiled as two variants gave rows other last bits on an H200).
@jit(do_not_specialize=["T", "has_cache"])
def gdn_fwd_kernel(
    q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions,
    T, q_scale, has_cache,
    stride_qt, stride_qh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, C: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    # Program (t, h): if a run starts at token t (a new slot, or a position that does not follow the
    # previous token's), walk that run for value head h.
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    pos0 = tl.load(positions + i_t)
    prev_pos = tl.load(positions + i_t - 1, mask=i_t > 0, other=-2)
    starts = (i_t == 0) | (prev_pos + 1 != pos0)
    caching = has_cache != 0
    slot = tl.load(state_ids + i_t, mask=caching, other=0).to(tl.int64)
    starts = starts | (caching & (tl.load(state_ids + i_t - 1, mask=caching & (i_t > 0), other=-1) != slot))
    if starts:
        _run(q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, T, q_scale, i_t, i_h, pos0, slot, caching,
             stride_qt, stride_qh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
             GROUP, HV, DK, DV, DK_PAD, DV_PAD, C, DOT_IN_FP32)


@jit
def _run(
    q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, T, q_scale, i_t, i_h, pos0, slot, caching,
    stride_qt, stride_qh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, C: tl.constexpr, DOT_IN_FP32: tl.constexpr,
):
    """Value head i_h of the run that starts at token i_t, chunk piece by chunk piece."""
    width = 2 * DK + 2 * DV + 1
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), tl.arange(0, DV_PAD)
    m_k, m_v = o_k < DK, o_v < DV
    i_kh = i_h // GROUP
    neg_a = -tl.exp(tl.load(a_log + i_h).to(tl.float32))
    bias = tl.load(dt_bias + i_h).to(tl.float32)

    # The run's start state and its open chunk's rows (offsets < pos0 % C), or zeros at position 0.
    p_base = rows_cache + slot.to(tl.int64) * (C * HV * width) + rows * (HV * width) + i_h * width  # [C]
    p_row = p_base[:, None]
    p_state = state + slot.to(tl.int64) * (HV * DK * DV) + i_h * (DK * DV) + o_k[:, None] * DV + o_v[None, :]
    first = pos0 % C
    cached = (rows < first) & (pos0 > 0) & caching  # [C]
    s0 = tl.load(p_state, mask=m_k[:, None] & m_v[None, :] & (pos0 > 0) & caching, other=0.0)
    kk = tl.where(cached[:, None] & m_k[None, :], tl.load(p_row + o_k[None, :], mask=cached[:, None] & m_k[None, :], other=0.0).to(tl.float32), 0.0)
    ww = tl.where(cached[:, None] & m_k[None, :], tl.load(p_row + DK + o_k[None, :], mask=cached[:, None] & m_k[None, :], other=0.0).to(tl.float32), 0.0)
    uu = tl.where(cached[:, None] & m_v[None, :], tl.load(p_row + 2 * DK + o_v[None, :], mask=cached[:, None] & m_v[None, :], other=0.0).to(tl.float32), 0.0)
    dd = tl.where(cached[:, None] & m_v[None, :], tl.load(p_row + 2 * DK + DV + o_v[None, :], mask=cached[:, None] & m_v[None, :], other=0.0).to(tl.float32), 0.0)
    cc = tl.where(cached, tl.load(p_base + 2 * DK + 2 * DV, mask=cached, other=0.0).to(tl.float32), 0.0)

    t = i_t.to(tl.int64)  # the token at offset `first` of the current chunk
    pos = pos0
    going = pos0 >= 0
    fresh = rows < 0  # the open chunk's rows computed by this call
    closed = pos0 < 0  # whether a chunk closed in this call
    while going:
        off = pos % C
        # This piece: the run's tokens from offset `off` to the chunk's end or the run's end.
        tok = t + rows - off  # [C]
        cand = (rows >= off) & (tok < T)
        p_tok = tl.load(positions + tok, mask=cand, other=-1)
        same = p_tok == pos + rows - off
        same = same & (~caching | (tl.load(state_ids + tok, mask=cand & caching, other=-1) == slot))
        stop = tl.min(tl.where(cand & ~same, rows, C), 0)  # the first offset past the piece
        stop = tl.minimum(stop, tl.max(tl.where(cand, rows, -1), 0) + 1)
        piece = (rows >= off) & (rows < stop)  # [C]
        tok64 = tok.to(tl.int64)
        m_pk = piece[:, None] & m_k[None, :]
        qf = tl.load(q + tok64[:, None] * stride_qt + i_kh * stride_qh + o_k[None, :], mask=m_pk, other=0.0).to(tl.float32)
        kf = tl.load(k + tok64[:, None] * stride_qt + i_kh * stride_qh + o_k[None, :], mask=m_pk, other=0.0).to(tl.float32)
        vf = tl.load(v + tok64[:, None] * stride_vt + i_h * stride_vh + o_v[None, :], mask=piece[:, None] & m_v[None, :], other=0.0).to(tl.float32)
        af = tl.load(a + tok64 * stride_at + i_h, mask=piece, other=0.0).to(tl.float32)
        bf = tl.load(b + tok64 * stride_at + i_h, mask=piece, other=0.0).to(tl.float32)
        # Gates and norms, per row.
        x = af + bias
        g = neg_a * tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(tl.where(x > SOFTPLUS_THRESHOLD, 0.0, x))))
        beta = 1.0 / (1.0 + tl.exp(-bf))
        qn = qf * (1.0 / tl.sqrt(tl.sum(qf * qf, 1) + L2_EPS))[:, None] * q_scale
        kn = kf * (1.0 / tl.sqrt(tl.sum(kf * kf, 1) + L2_EPS))[:, None]
        kk = tl.where(piece[:, None], kn, kk)
        # The decay cumsum in row order.
        c_prev = _at(cc, rows, off - 1) * (off > 0)
        r = off
        while r < stop:
            c_prev = c_prev + _at(g, rows, r)
            cc = tl.where(rows == r, c_prev, cc)
            r += 1
        gram = _dot(kk, tl.trans(kk), DOT_IN_FP32)  # [C, C]
        below = rows[None, :] < rows[:, None]
        system = tl.where(below, beta[:, None] * gram * tl.exp(tl.where(below, cc[:, None] - cc[None, :], 0.0)), 0.0)
        # Forward substitution, row by row.
        scale_k = beta * tl.exp(cc)
        r = off
        while r < stop:
            a_r = _row_of(system, rows, r)  # [C]
            w_r = _at(scale_k, rows, r) * _row_of(kk, rows, r) - tl.sum(a_r[:, None] * ww, 0)
            u_r = _at(beta, rows, r) * _row_of(vf, rows, r) - tl.sum(a_r[:, None] * uu, 0)
            ww = tl.where(rows[:, None] == r, w_r[None, :], ww)
            uu = tl.where(rows[:, None] == r, u_r[None, :], uu)
            r += 1
        dd = tl.where(piece[:, None], uu - _dot(ww, s0, DOT_IN_FP32), dd)
        upto = rows[None, :] <= rows[:, None]
        scores = tl.where(upto, _dot(qn, tl.trans(kk), DOT_IN_FP32) * tl.exp(tl.where(upto, cc[:, None] - cc[None, :], 0.0)), 0.0)
        o = tl.exp(cc)[:, None] * _dot(qn, s0, DOT_IN_FP32) + _dot(scores, dd, DOT_IN_FP32)
        o = tl.where(o == 0.0, 0.0, o)
        tl.store(out + tok64[:, None] * stride_ot + i_h * stride_oh + o_v[None, :], o.to(out.dtype.element_ty), mask=piece[:, None] & m_v[None, :])
        fresh = fresh | piece
        if stop == C:  # the chunk closes: the next chunk's start state, and no open rows
            c_last = _at(cc, rows, C - 1)
            s0 = tl.exp(c_last) * s0 + _dot(tl.trans(kk * tl.exp(c_last - cc)[:, None]), dd, DOT_IN_FP32)
            kk, ww, uu, dd, cc = kk * 0.0, ww * 0.0, uu * 0.0, dd * 0.0, cc * 0.0
            fresh, closed = rows < 0, pos0 >= 0
        t += stop - off
        pos += stop - off
        going = (stop == C) & (t < T)
        if going:
            going = tl.load(positions + t, mask=t < T, other=-1) == pos
            going = going & (~caching | (tl.load(state_ids + t, mask=caching & (t < T), other=-1) == slot))
    if caching:
        # The open chunk's rows this call computed (the earlier ones are in the slot already) and, where it
        # changed (a chunk closed) or was never stored (the run began the sequence), its start state.
        m_open = fresh & (rows < pos % C)
        tl.store(p_row + o_k[None, :], kk, mask=m_open[:, None] & m_k[None, :])
        tl.store(p_row + DK + o_k[None, :], ww, mask=m_open[:, None] & m_k[None, :])
        tl.store(p_row + 2 * DK + o_v[None, :], uu, mask=m_open[:, None] & m_v[None, :])
        tl.store(p_row + 2 * DK + DV + o_v[None, :], dd, mask=m_open[:, None] & m_v[None, :])
        tl.store(p_base + 2 * DK + 2 * DV, cc, mask=m_open)
        if closed | (pos0 == 0):
            tl.store(p_state, s0, mask=m_k[:, None] & m_v[None, :])


def gdn_fwd(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size: int, out_dtype: torch.dtype,
            num_warps: int) -> Tensor:
    num_tokens, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    out = v.new_empty((num_tokens, num_v_heads, v_dim), dtype=out_dtype)
    if num_tokens == 0:
        return out
    q, k, v, a, b = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, a, b))
    if k.stride() != q.stride():  # the kernel reads both with q's strides (the layer's are views of one tensor)
        q, k = q.contiguous(), k.contiguous()
    has_cache = state is not None
    dummy, scratch = positions.new_zeros(1), v.new_zeros(1, dtype=torch.float32)
    gdn_fwd_kernel[(num_tokens, num_v_heads)](
        q, k, v, a, b, a_log, dt_bias, out, state if has_cache else scratch, rows if has_cache else scratch, state_ids if has_cache else dummy,
        positions.contiguous(), num_tokens, float(k_dim**-0.5), int(has_cache),
        q.stride(0), q.stride(1), v.stride(0), v.stride(1), a.stride(0), out.stride(0), out.stride(1),
        GROUP=num_v_heads // num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim,
        DK_PAD=max(16, triton.next_power_of_2(k_dim)), DV_PAD=max(16, triton.next_power_of_2(v_dim)), C=chunk_size,
        DOT_IN_FP32=triton_support.interpreting(), num_warps=num_warps,
    )
    return out


class _TritonGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a, b, a_log, dt_bias, positions, chunk_size, dtypes, num_warps):
        ctx.save_for_backward(q, k, v, a, b, a_log, dt_bias, positions)
        ctx.chunk_size, ctx.dtypes = chunk_size, dtypes
        return gdn_fwd(q, k, v, a, b, a_log, dt_bias, None, None, None, positions, chunk_size, torch_dtype(dtypes["output_dtype"]), num_warps)

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(need) for t, need in zip(saved[:7], ctx.needs_input_grad[:7])]
        with torch.enable_grad():
            out = native.gdn_core(*inputs, positions=saved[7], chunk_size=ctx.chunk_size, **ctx.dtypes)
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad.to(out.dtype), allow_unused=True))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None, None, None)


def check_constants(constants: dict) -> None:
    """Refuse dtypes and chunk sizes the kernel does not implement (one-line ValueErrors)."""
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    for name in ("input_dtype", "output_dtype"):
        if constants[name] not in DTYPES:
            raise ValueError(f"{ID}: {name} must be one of {', '.join(DTYPES)}, got {constants[name]!r}")
    chunk = constants["chunk_size"]
    if not isinstance(chunk, int) or chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"{ID}: chunk_size must be a power of two >= 16 (tl.dot's smallest tile), got {chunk!r}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16):
        raise ValueError(f"{ID}: num_warps must be a power of two <= 16, got {constants['num_warps']!r}")


def gdn_core(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, state: Tensor | None = None,
             rows: Tensor | None = None, state_ids: Tensor | None = None, positions: Tensor | None = None, *, input_dtype: str,
             output_dtype: str, accum_dtype: str, chunk_size: int, num_warps: int) -> Tensor:
    """Same arguments and result as `reference.gdn_core` (its docstring has the layout)."""
    check_constants(dict(input_dtype=input_dtype, output_dtype=output_dtype, accum_dtype=accum_dtype, chunk_size=chunk_size,
                         num_warps=num_warps))
    if positions is None:
        raise ValueError("gdn.core: positions are required")
    check_inputs(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size, input_dtype)
    require_device(ID, q, k, v, a, b)
    if needs_grad(q, k, v, a, b, a_log, dt_bias):
        dtypes = dict(input_dtype=input_dtype, output_dtype=output_dtype)
        return _TritonGDN.apply(q, k, v, a, b, a_log, dt_bias, positions, chunk_size, dtypes, num_warps)
    return gdn_fwd(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size, torch_dtype(output_dtype), num_warps)


SOURCES = (gdn_fwd_kernel, _run, _row_of, _at, _dot, triton_support)


def register(registry) -> None:
    """Register gdn.core.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="gdn.core", cases=ALL_CASES, fn=gdn_core,
                               check_constants=check_constants, sources=SOURCES))
