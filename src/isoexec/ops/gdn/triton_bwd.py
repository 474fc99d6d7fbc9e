"""gdn.core.triton's backward pass (trainer_fwd): the gradients of the chunk form as Triton kernels. Only the
forward must give the engine's bits; the backward must be correct (its tests: float64 autograd of the
token-by-token recurrence), and here it is fast rather than invariant, with a tile of its own.

A trainer call has no cache: every run starts at position 0, and chunk n of a run is its rows
[nC, (n+1)C). Per chunk, with E_ij = e^{c_i - c_j}, A = β (k kᵀ ∘ E) below the diagonal, T = (I + A)^-1,
X = β e^c k, Y = β v, W = T X, U = T Y, δ = U - W S, P = (q kᵀ ∘ E) on and below it,
o = e^c (q S) + P δ and the next chunk's S' = e^{c_C} S + (e^{c_C - c} k)ᵀ δ, given dO and dS':

    dδ = Pᵀ dO + (e^{c_C - c} k) dS'
    dS = e^{c_C} dS' + qᵀ (e^c dO) - Wᵀ dδ
    dP = dO δᵀ,  dW = -dδ Sᵀ,  dT = dδ Yᵀ + dW Xᵀ,  dY = Tᵀ dδ,  dX = Tᵀ dW,  dA = -Tᵀ dT Tᵀ,

then the products' rules for q, k, β and v, and for c (each E_ij adds to dc_i and takes from dc_j), and
dg = the reverse cumsum of dc within the chunk. Three launches:

1. `gdn_states_kernel`, a program per (run, value head, block of value columns), walks each run's chunks
   forward and stores the state at every chunk's start (S_0 = 0), by the forward's chunk arithmetic;
2. `gdn_dstates_kernel`, the same grid, walks them backward and stores dS at every chunk's end (dδ and dS
   need no state);
3. `gdn_bwd_kernel`, a program per (chunk, value head, value block), all chunks at once: the chunk's
   gradients from its S and dS'.

A program's gradients for q, k, β and g are its value block's share (every term is linear in dδ and dO,
which split by value columns): they land in per-block buffers that the host sums, together with the
value heads sharing a key head, before the l2 norms' and the gates' backward (elementwise, in torch).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import triton_support
from ..triton_support import jit, tl, triton
from .reference import L2_EPS as _L2_EPS
from .reference import SOFTPLUS_THRESHOLD
from .triton import PRECISIONS, SUB, _gates, _inverse, _mm, _operand, _padded, _rows_mask, _strided16

L2_EPS = tl.constexpr(_L2_EPS) if tl is not None else _L2_EPS


@jit
def _chunk(k, v, a, b, tok, m_row, o_k, o_v, i_kh, i_h, neg_a, bias, stride_kt, stride_kh, stride_vt, stride_vh, stride_at,
           DK: tl.constexpr, DK_PAD: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    """A chunk's rows (zero past the run): k [C, DK_PAD] and its l2-normalised kn, v [C, BV], g and β [C]."""
    # Every stride is a multiple of 16 elements (gdn_bwd pads where not): 16-byte vector loads.
    k_rows = tl.multiple_of(tok * stride_kt + i_kh * stride_kh, 16)
    v_rows = tl.multiple_of(tok * stride_vt + i_h * stride_vh, 16)
    kf = tl.load(k + k_rows[:, None] + o_k[None, :], mask=_rows_mask(m_row, o_k < DK, DK == DK_PAD), other=0.0).to(tl.float32)
    vf = tl.load(v + v_rows[:, None] + o_v[None, :], mask=_rows_mask(m_row, o_v < DV, DV % BV == 0), other=0.0).to(tl.float32)
    g, beta = _gates(tl.load(a + tok * stride_at + i_h, mask=m_row, other=0.0), tl.load(b + tok * stride_at + i_h, mask=m_row, other=0.0),
                         neg_a, bias)
    kn = kf * (1.0 / tl.sqrt(tl.sum(kf * kf, 1) + L2_EPS))[:, None]
    return kn, vf, tl.where(m_row, g, 0.0), tl.where(m_row, beta, 0.0)


@jit
def _solve(kn, vf, g, beta, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """-> (c, E below the diagonal, k kᵀ, T, X, Y, W, U) of a chunk, the forward's arithmetic."""
    rows = tl.arange(0, C)
    below = rows[:, None] > rows[None, :]
    c = tl.cumsum(g, 0)
    e_below = tl.where(below, tl.exp(tl.where(below, c[:, None] - c[None, :], 0.0)), 0.0)
    kn_op = _operand(kn, PRECISION, INTERPRET)
    gram = _mm(kn_op, tl.trans(kn_op), PRECISION, INTERPRET)
    inverse = _inverse(beta[:, None] * gram * e_below, C, SUB, PRECISION, INTERPRET)
    x = (beta * tl.exp(c))[:, None] * kn
    y = beta[:, None] * vf
    inv_op = _operand(inverse, PRECISION, INTERPRET)
    w = _mm(inv_op, _operand(x, PRECISION, INTERPRET), PRECISION, INTERPRET)
    u = _mm(inv_op, _operand(y, PRECISION, INTERPRET), PRECISION, INTERPRET)
    return c, e_below, gram, inverse, x, y, w, u


@jit
def _dot(a, b, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    return _mm(_operand(a, PRECISION, INTERPRET), _operand(b, PRECISION, INTERPRET), PRECISION, INTERPRET)


@jit(do_not_specialize=["stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at"])
def gdn_states_kernel(k, v, a, b, a_log, dt_bias, states, run_first, run_len, run_chunk0,
                      stride_kt, stride_kh, stride_vt, stride_vh, stride_at,
                      GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, BV: tl.constexpr,
                      C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    i_r, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t0, n, chunk0 = tl.load(run_first + i_r).to(tl.int64), tl.load(run_len + i_r), tl.load(run_chunk0 + i_r).to(tl.int64)
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_state = (o_k < DK)[:, None] & (o_v < DV)[None, :]
    neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
    s = tl.zeros([DK_PAD, BV], dtype=tl.float32)
    j = 0
    while j * C < n:
        tl.store(states + ((chunk0 + j) * HV + i_h) * (DK * DV) + o_k[:, None] * DV + o_v[None, :], s, mask=m_state)
        m_row = rows < n - j * C
        kn, vf, g, beta = _chunk(k, v, a, b, t0 + j * C + rows, m_row, o_k, o_v, i_h // GROUP, i_h, neg_a, bias,
                                 stride_kt, stride_kh, stride_vt, stride_vh, stride_at, DK, DK_PAD, DV, BV)
        c, e_below, gram, inverse, x, y, w, u = _solve(kn, vf, g, beta, C, SUB, PRECISION, INTERPRET)
        delta = u - _dot(w, s, PRECISION, INTERPRET)
        c_last = tl.sum(tl.where(rows == C - 1, c, 0.0), 0)
        s = tl.exp(c_last) * s + _dot(tl.trans(kn * tl.exp(c_last - c)[:, None]), delta, PRECISION, INTERPRET)
        j += 1


@jit
def _queries(q, tok, m_row, o_k, i_kh, q_scale, stride_qt, stride_qh, DK: tl.constexpr, DK_PAD: tl.constexpr):
    """A chunk's queries, l2-normalised and scaled (zero past the run)."""
    q_rows = tl.multiple_of(tok * stride_qt + i_kh * stride_qh, 16)
    qf = tl.load(q + q_rows[:, None] + o_k[None, :], mask=_rows_mask(m_row, o_k < DK, DK == DK_PAD), other=0.0).to(tl.float32)
    return qf * (1.0 / tl.sqrt(tl.sum(qf * qf, 1) + L2_EPS))[:, None] * q_scale


@jit
def _d_delta(qn, kn, c, d_o, ds, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """dδ = Pᵀ dO + (e^{c_C - c} k) dS', with P and the scores q kᵀ it is made of."""
    rows = tl.arange(0, C)
    upto = rows[:, None] >= rows[None, :]
    e_upto = tl.where(upto, tl.exp(tl.where(upto, c[:, None] - c[None, :], 0.0)), 0.0)
    qk = _dot(qn, tl.trans(kn), PRECISION, INTERPRET)
    scores = tl.where(upto, qk * e_upto, 0.0)
    decay_k = tl.exp(tl.sum(tl.where(rows == C - 1, c, 0.0), 0) - c)
    d_delta = _dot(tl.trans(scores), d_o, PRECISION, INTERPRET) + _dot(kn * decay_k[:, None], ds, PRECISION, INTERPRET)
    return d_delta, e_upto, qk, decay_k


@jit(do_not_specialize=["q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at",
                        "stride_dt", "stride_dh"])
def gdn_dstates_kernel(q, k, v, a, b, a_log, dt_bias, d_out, dstates, run_first, run_len, run_chunk0, q_scale,
                       stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_dt, stride_dh,
                       GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr,
                       BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The reverse walk: dS at every chunk's end, dS = e^{c_C} dS' + qᵀ (e^c dO) - Wᵀ dδ (no state needed)."""
    i_r, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t0, n, chunk0 = tl.load(run_first + i_r).to(tl.int64), tl.load(run_len + i_r), tl.load(run_chunk0 + i_r).to(tl.int64)
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
    ds = tl.zeros([DK_PAD, BV], dtype=tl.float32)
    j = tl.cdiv(n, C) - 1
    while j >= 0:
        tl.store(dstates + ((chunk0 + j) * HV + i_h) * (DK * DV) + o_k[:, None] * DV + o_v[None, :], ds, mask=m_k[:, None] & m_v[None, :])
        m_row = rows < n - j * C
        tok = t0 + j * C + rows
        kn, vf, g, beta = _chunk(k, v, a, b, tok, m_row, o_k, o_v, i_h // GROUP, i_h, neg_a, bias, stride_kt, stride_kh, stride_vt,
                                 stride_vh, stride_at, DK, DK_PAD, DV, BV)
        c, e_below, gram, inverse, x, y, w, u = _solve(kn, vf, g, beta, C, SUB, PRECISION, INTERPRET)
        qn = _queries(q, tok, m_row, o_k, i_h // GROUP, q_scale, stride_qt, stride_qh, DK, DK_PAD)
        d_rows = tl.multiple_of(tok * stride_dt + i_h * stride_dh, 16)
        d_o = tl.load(d_out + d_rows[:, None] + o_v[None, :], mask=_rows_mask(m_row, m_v, DV % BV == 0), other=0.0).to(tl.float32)
        d_delta, e_upto, qk, decay_k = _d_delta(qn, kn, c, d_o, ds, C, PRECISION, INTERPRET)
        c_last = tl.sum(tl.where(rows == C - 1, c, 0.0), 0)
        ds = tl.exp(c_last) * ds + _dot(tl.trans(qn), tl.exp(c)[:, None] * d_o, PRECISION, INTERPRET) \
            - _dot(tl.trans(w), d_delta, PRECISION, INTERPRET)
        j -= 1


@jit(do_not_specialize=["q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at",
                        "stride_dt", "stride_dh", "T"])
def gdn_bwd_kernel(q, k, v, a, b, a_log, dt_bias, d_out, states, dstates, dq, dk, dv, dbeta, dg, chunk_first, chunk_len, q_scale,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_dt, stride_dh, T,
                   GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, BV: tl.constexpr,
                   C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """One chunk's gradients, from its start state S and the gradient dS' at its end: every chunk in parallel."""
    i_n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    m_state = m_k[:, None] & m_v[None, :]
    i_kh = i_h // GROUP
    neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
    below = rows[:, None] > rows[None, :]
    upto = rows[:, None] >= rows[None, :]
    m_row = rows < tl.load(chunk_len + i_n)
    tok = tl.load(chunk_first + i_n).to(tl.int64) + rows
    p_state = (i_n.to(tl.int64) * HV + i_h) * (DK * DV) + o_k[:, None] * DV + o_v[None, :]
    s = tl.load(states + p_state, mask=m_state, other=0.0)
    ds = tl.load(dstates + p_state, mask=m_state, other=0.0)
    kn, vf, g, beta = _chunk(k, v, a, b, tok, m_row, o_k, o_v, i_kh, i_h, neg_a, bias, stride_kt, stride_kh, stride_vt, stride_vh,
                             stride_at, DK, DK_PAD, DV, BV)
    c, e_below, gram, inverse, x, y, w, u = _solve(kn, vf, g, beta, C, SUB, PRECISION, INTERPRET)
    qn = _queries(q, tok, m_row, o_k, i_kh, q_scale, stride_qt, stride_qh, DK, DK_PAD)
    delta = u - _dot(w, s, PRECISION, INTERPRET)  # [C, BV]
    m_out = _rows_mask(m_row, m_v, DV % BV == 0)
    d_rows = tl.multiple_of(tok * stride_dt + i_h * stride_dh, 16)
    d_o = tl.load(d_out + d_rows[:, None] + o_v[None, :], mask=m_out, other=0.0).to(tl.float32)
    d_delta, e_upto, qk, decay_k = _d_delta(qn, kn, c, d_o, ds, C, PRECISION, INTERPRET)
    c_last = tl.sum(tl.where(rows == C - 1, c, 0.0), 0)
    e_c = tl.exp(c)
    # The outputs' products: P δ and e^c (q S).
    d_p = tl.where(upto, _dot(d_o, tl.trans(delta), PRECISION, INTERPRET), 0.0)
    d_scores = d_p * e_upto
    m_kout = _rows_mask(m_row, m_k, DK == DK_PAD)
    p_part = (i_v * T + tok) * HV + i_h  # [C]: this value block's share
    d_qn = _dot(d_scores, kn, PRECISION, INTERPRET) + e_c[:, None] * _dot(d_o, tl.trans(s), PRECISION, INTERPRET)
    tl.store(dq + p_part[:, None] * DK + o_k[None, :], d_qn, mask=m_kout)
    d_kn = _dot(tl.trans(d_scores), qn, PRECISION, INTERPRET)
    d_c = e_c * tl.sum(d_o * _dot(qn, s, PRECISION, INTERPRET), 1)
    # δ = T Y - T X S, through T = (I + A)^-1 into A = β (k kᵀ ∘ E).
    d_w = -_dot(d_delta, tl.trans(s), PRECISION, INTERPRET)  # [C, DK_PAD]
    d_t = _dot(d_delta, tl.trans(y), PRECISION, INTERPRET) + _dot(d_w, tl.trans(x), PRECISION, INTERPRET)
    d_y = _dot(tl.trans(inverse), d_delta, PRECISION, INTERPRET)
    tl.store(dv + (tok[:, None] * HV + i_h) * DV + o_v[None, :], beta[:, None] * d_y, mask=m_out)
    d_x = _dot(tl.trans(inverse), d_w, PRECISION, INTERPRET)
    d_a = tl.where(below, -_dot(tl.trans(inverse), _dot(d_t, tl.trans(inverse), PRECISION, INTERPRET), PRECISION, INTERPRET), 0.0)
    d_gram = d_a * beta[:, None] * e_below
    d_kn += _dot(d_gram, kn, PRECISION, INTERPRET) + _dot(tl.trans(d_gram), kn, PRECISION, INTERPRET)
    x_dot = tl.sum(d_x * kn, 1)
    d_beta = tl.sum(d_a * gram * e_below, 1) + tl.sum(d_y * vf, 1) + e_c * x_dot
    d_kn += (beta * e_c)[:, None] * d_x
    d_c += beta * e_c * x_dot
    # Every E_ij = e^{c_i - c_j} (in P and in A): + to dc_i, - to dc_j.
    d_e = (d_p * qk + d_a * beta[:, None] * gram) * e_upto
    d_c += tl.sum(d_e, 1) - tl.sum(d_e, 0)
    # The next chunk's start state S' = e^{c_C} S + (e^{c_C - c} k)ᵀ δ.
    d_decayed = _dot(delta, tl.trans(ds), PRECISION, INTERPRET)  # [C, DK_PAD]
    d_kn += decay_k[:, None] * d_decayed
    t_j = decay_k * tl.sum(kn * d_decayed, 1)
    d_c_last = tl.exp(c_last) * tl.sum(tl.sum(s * ds, 1), 0) + tl.sum(t_j, 0)
    d_c += tl.where(rows == C - 1, d_c_last, 0.0) - t_j
    tl.store(dk + p_part[:, None] * DK + o_k[None, :], d_kn, mask=m_kout)
    tl.store(dbeta + p_part, d_beta, mask=m_row)
    tl.store(dg + p_part, tl.cumsum(d_c, 0, reverse=True), mask=m_row)


def _runs(positions: Tensor, chunk_size: int) -> tuple[Tensor, ...]:
    """A trainer call's runs and chunks: per run (first token, length, first chunk id), per chunk (first token,
    length), int32 each."""
    num_tokens = positions.shape[0]
    starts = torch.cat([positions.new_ones(1, dtype=torch.bool), positions[1:] != positions[:-1] + 1])
    first = torch.nonzero(starts).flatten()
    length = torch.diff(first, append=first.new_tensor([num_tokens]))
    chunks = (length + chunk_size - 1) // chunk_size
    chunk0 = torch.cumsum(chunks, 0) - chunks
    run_of_chunk = torch.repeat_interleave(torch.arange(first.shape[0], device=first.device), chunks)
    index = torch.arange(run_of_chunk.shape[0], device=first.device) - chunk0[run_of_chunk]  # the chunk's place in its run
    chunk_first = first[run_of_chunk] + index * chunk_size
    chunk_len = torch.minimum(length[run_of_chunk] - index * chunk_size, torch.full_like(index, chunk_size))
    return tuple(t.to(torch.int32) for t in (first, length, chunk0, chunk_first, chunk_len))


def _l2_norm_backward(x: Tensor, grad: Tensor, scale: float) -> Tensor:
    """x [..., D] -> the gradient of scale · x · rsqrt(Σ x² + eps) given `grad` of it (fp32)."""
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) + _L2_EPS)
    return scale * (r * grad - r**3 * (x * grad).sum(-1, keepdim=True) * x)


# The backward's own tile (its bits are nobody's contract): 64 value columns, 8 warps, the configuration that
# compiles with no spill (states, dstates) or the least (the chunk gradients, 0.8 KB) for sm_90 at heads of 128.
BLOCK_V, NUM_WARPS = 64, 8


def gdn_bwd(q, k, v, a, b, a_log, dt_bias, positions, grad: Tensor, chunk_size: int, precision: str) -> tuple[Tensor, ...]:
    """The gradients of gdn_core (a trainer call: no cache) with respect to q, k, v, a, b, A_log, dt_bias; the
    products' operands as the forward's `dot_precision`."""
    num_tokens, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    group = num_v_heads // num_k_heads
    device = v.device
    k_pad, v_pad = _padded(k_dim), _padded(v_dim)
    q, k, v, grad = _strided16(q, k_pad), _strided16(k, k_pad), _strided16(v, v_pad), _strided16(grad, v_pad)
    a, b = a.contiguous(), b.contiguous()
    a_log, dt_bias = a_log.contiguous(), dt_bias.contiguous()
    first, length, chunk0, chunk_first, chunk_len = _runs(positions, chunk_size)
    num_chunks = chunk_first.shape[0]
    block_v, num_warps = min(BLOCK_V, v_pad), NUM_WARPS
    grid = (first.shape[0], num_v_heads, triton.cdiv(v_dim, block_v))
    num_blocks_v = grid[2]
    dims = dict(GROUP=group, HV=num_v_heads, DK=k_dim, DV=v_dim, DK_PAD=k_pad, BV=block_v, C=chunk_size, SUB=SUB,
                PRECISION=PRECISIONS[precision], INTERPRET=triton_support.interpreting())
    f32 = dict(dtype=torch.float32, device=device)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), grad.stride(0), grad.stride(1))
    states = torch.empty(num_chunks, num_v_heads, k_dim, v_dim, **f32)
    gdn_states_kernel[grid](k, v, a, b, a_log, dt_bias, states, first, length, chunk0, *strides[2:7], num_warps=num_warps, **dims)
    dstates = torch.empty(num_chunks, num_v_heads, k_dim, v_dim, **f32)
    gdn_dstates_kernel[grid](q, k, v, a, b, a_log, dt_bias, grad, dstates, first, length, chunk0, float(k_dim**-0.5), *strides,
                             num_warps=num_warps, **dims)
    dqn = torch.empty(num_blocks_v, num_tokens, num_v_heads, k_dim, **f32)
    dkn = torch.empty(num_blocks_v, num_tokens, num_v_heads, k_dim, **f32)
    dv = torch.empty(num_tokens, num_v_heads, v_dim, **f32)
    dbeta = torch.empty(num_blocks_v, num_tokens, num_v_heads, **f32)
    dg = torch.empty(num_blocks_v, num_tokens, num_v_heads, **f32)
    gdn_bwd_kernel[(num_chunks, num_v_heads, num_blocks_v)](
        q, k, v, a, b, a_log, dt_bias, grad, states, dstates, dqn, dkn, dv, dbeta, dg, chunk_first, chunk_len, float(k_dim**-0.5), *strides,
        num_tokens, num_warps=num_warps, **dims)
    # The value blocks' shares, the value heads of one key head, then the norms' and the gates' backward.
    dqn = dqn.sum(0).view(num_tokens, num_k_heads, group, k_dim).sum(2)
    dkn = dkn.sum(0).view(num_tokens, num_k_heads, group, k_dim).sum(2)
    dq = _l2_norm_backward(q.float(), dqn, k_dim**-0.5)
    dk = _l2_norm_backward(k.float(), dkn, 1.0)
    dbeta, dg = dbeta.sum(0), dg.sum(0)
    beta = torch.sigmoid(b.float())
    db = dbeta * beta * (1 - beta)
    x = a.float() + dt_bias.float()
    rate = torch.exp(a_log.float())
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(torch.where(x > SOFTPLUS_THRESHOLD, 0.0, x))))
    dx = -rate * torch.where(x > SOFTPLUS_THRESHOLD, 1.0, torch.sigmoid(x)) * dg
    da_log = (dg * -rate * softplus).sum(0)
    return dq, dk, dv, dx, db, da_log, dx.sum(0)


SOURCES = (gdn_states_kernel, gdn_dstates_kernel, gdn_bwd_kernel, _chunk, _solve, _queries, _d_delta, _dot)
