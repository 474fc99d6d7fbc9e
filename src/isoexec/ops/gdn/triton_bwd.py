"""gdn.core.triton's backward pass (trainer_fwd): the gradients of the chunk form as Triton kernels. Only the
forward must give the engine's bits; the backward must be correct (its tests: float64 autograd of the
token-by-token recurrence), and here it is fast rather than invariant. It therefore takes chunks of its own
size (`CHUNK`, larger than the contract's): every chunk size computes the same function, and bigger chunks mean
fewer serial steps, fewer stored states and fuller tensor-core tiles.

A trainer call has no cache: every run starts at position 0, and chunk n of a run is its rows
[nC, (n+1)C). Per chunk, with E_ij = e^{c_i - c_j}, A = β (k kᵀ ∘ E) below the diagonal, T = (I + A)^-1,
X = β e^c k, Y = β v, W = T X, U = T Y, δ = U - W S, P = (q kᵀ ∘ E) on and below it,
o = e^c (q S) + P δ and the next chunk's S' = e^{c_C} S + (e^{c_C - c} k)ᵀ δ, given dO and dS':

    dδ = Pᵀ dO + (e^{c_C - c} k) dS'
    dS = e^{c_C} dS' + qᵀ (e^c dO) - Wᵀ dδ
    dP = dO δᵀ,  dW = -dδ Sᵀ,  dT = dδ Yᵀ + dW Xᵀ,  dY = Tᵀ dδ,  dX = Tᵀ dW,  dA = -Tᵀ dT Tᵀ,

then the products' rules for q, k, β and v, and for c (each E_ij adds to dc_i and takes from dc_j), and
dg = the reverse cumsum of dc within the chunk. As flash-linear-attention splits its backward, only the two
state chains are serial, and they carry nothing but the chain's own products:

1. `gdn_bwd_wy_kernel`, a program per (chunk, value head): T, W and U of every chunk at once;
2. `gdn_bwd_states_kernel`, a program per (run, value head, block of value columns): the forward walk,
   δ = U - W S and S' from it (two products a chunk), storing S at every chunk's start and δ;
3. `gdn_bwd_dstates_kernel`, the same grid backward: dδ and dS (the chunk-local Pᵀ dO and qᵀ (e^c dO) beside
   the chain's two products), storing dS' at every chunk's end and dδ; the two walks share no data, so
   `gdn_bwd_walks_kernel` runs both in one launch (ONE_WALK_LAUNCH); with WALK_INPUTS, what they take of a chunk
   that no value column changes (c, the decayed keys, the queries, the scores) comes from
   `gdn_bwd_walk_inputs_kernel`, a program per (chunk, value head) before them; with WALK_STAGES, each walk steps
   through its chunks in a loop Triton pipelines (the next chunks' tiles loaded while one computes);
4. a program per (chunk, value head), all chunks at once: every gradient of the chunk from S, dS', δ and dδ,
   the value blocks in a loop (no per-block partial sums), the gates' backward at the end; as one kernel
   (`gdn_bwd_chunk_kernel`) or two (`gdn_bwd_outputs_kernel`: through the outputs and the next state;
   `gdn_bwd_wy_grads_kernel`: through T, W and U), with SPLIT;
5. `gdn_bwd_norms_kernel`: the l2 norms' backward of q and k, the shares of the value heads sharing a key
   head summed.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from ...env import EnvError, switch
from .. import triton_support
from ..triton_support import cdiv, jit, tl
from .runs import Runs, find_runs, pieces
from .triton_tiles import (L2_EPS, PRECISIONS, SOFTPLUS_THRESHOLD, SUB, _gates, _inverse, _mm, _operand, _padded, _rows_mask, _stored,
                           _strided16)


@jit
def _dot(a, b, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    return _mm(_operand(a, PRECISION, INTERPRET), _operand(b, PRECISION, INTERPRET), PRECISION, INTERPRET)


@jit
def _keys(k, a, b, tok, m_row, o_k, i_kh, i_h, neg_a, bias, stride_kt, stride_kh, stride_at, DK: tl.constexpr, DK_PAD: tl.constexpr):
    """A chunk's l2-normalised keys [C, DK_PAD], gates g and β [C] (zero past the run)."""
    # Every stride is a multiple of 16 elements (gdn_bwd pads where not): 16-byte vector loads.
    k_rows = tl.multiple_of(tok * stride_kt + i_kh * stride_kh, 16)
    kf = tl.load(k + k_rows[:, None] + o_k[None, :], mask=_rows_mask(m_row, o_k < DK, DK == DK_PAD), other=0.0).to(tl.float32)
    g, beta = _gates(tl.load(a + tok * stride_at + i_h, mask=m_row, other=0.0), tl.load(b + tok * stride_at + i_h, mask=m_row, other=0.0),
                     neg_a, bias)
    kn = kf * (1.0 / tl.sqrt(tl.sum(kf * kf, 1) + L2_EPS))[:, None]
    return kn, tl.where(m_row, g, 0.0), tl.where(m_row, beta, 0.0)


@jit
def _queries(q, tok, m_row, o_k, i_kh, q_scale, stride_qt, stride_qh, DK: tl.constexpr, DK_PAD: tl.constexpr):
    """A chunk's queries, l2-normalised and scaled (zero past the run)."""
    q_rows = tl.multiple_of(tok * stride_qt + i_kh * stride_qh, 16)
    qf = tl.load(q + q_rows[:, None] + o_k[None, :], mask=_rows_mask(m_row, o_k < DK, DK == DK_PAD), other=0.0).to(tl.float32)
    return qf * (1.0 / tl.sqrt(tl.sum(qf * qf, 1) + L2_EPS))[:, None] * q_scale


@jit
def _last(c, C: tl.constexpr):
    """c's last row: the decay over the whole chunk (rows past a run add g = 0)."""
    return tl.sum(tl.where(tl.arange(0, C) == C - 1, c, 0.0), 0)


@jit
def _decays(c, C: tl.constexpr, BELOW: tl.constexpr):
    """E_ij = e^{c_i - c_j} below the diagonal (BELOW) or on and below it, zero elsewhere."""
    rows = tl.arange(0, C)
    if BELOW:
        m = rows[:, None] > rows[None, :]
    else:
        m = rows[:, None] >= rows[None, :]
    return tl.where(m, tl.exp(tl.where(m, c[:, None] - c[None, :], 0.0)), 0.0)


@jit(do_not_specialize=["stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at"])
def gdn_bwd_wy_kernel(k, v, a, b, a_log, dt_bias, t_buf, w_buf, u_buf, chunk_first, chunk_len, stride_kt, stride_kh, stride_vt, stride_vh,
                      stride_at, GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr,
                      DV_PAD: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """A chunk's T = (I + A)^-1, W = T (β e^c k) and U = T (β v), by the forward's arithmetic (fp32 out)."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    if tl.load(chunk_len + i_n) > 0:  # a chunk of no rows (runs.pieces makes none) computes nothing
        rows = tl.arange(0, C)
        o_k, o_v = tl.arange(0, DK_PAD), tl.arange(0, DV_PAD)
        m_row = rows < tl.load(chunk_len + i_n)
        tok = tl.load(chunk_first + i_n).to(tl.int64) + rows
        neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
        kn, g, beta = _keys(k, a, b, tok, m_row, o_k, i_h // GROUP, i_h, neg_a, bias, stride_kt, stride_kh, stride_at, DK, DK_PAD)
        c = tl.cumsum(g, 0)
        # The keys enter products alone from here: held as the products' operands (as in the reverse walk).
        x = _operand((beta * tl.exp(c))[:, None] * kn, PRECISION, INTERPRET)
        kn = _operand(kn, PRECISION, INTERPRET)
        system = beta[:, None] * _dot(kn, tl.trans(kn), PRECISION, INTERPRET) * _decays(c, C, True)
        inverse = _inverse(system, C, SUB, PRECISION, INTERPRET)
        tl.store(t_buf + (i_n.to(tl.int64) * HV + i_h) * (C * C) + rows[:, None] * C + rows[None, :], inverse.to(t_buf.dtype.element_ty))
        p = tok * HV + i_h
        w = _dot(inverse, x, PRECISION, INTERPRET)
        tl.store(w_buf + p[:, None] * DK + o_k[None, :], w.to(w_buf.dtype.element_ty), mask=_rows_mask(m_row, o_k < DK, DK == DK_PAD))
        # The values after the keys' work (their registers are free by then: loaded first, they spilled).
        v_rows = tl.multiple_of(tok * stride_vt + i_h * stride_vh, 16)
        m_v = _rows_mask(m_row, o_v < DV, DV == DV_PAD)
        vf = tl.load(v + v_rows[:, None] + o_v[None, :], mask=m_v, other=0.0).to(tl.float32)
        tl.store(u_buf + p[:, None] * DV + o_v[None, :], _dot(inverse, beta[:, None] * vf, PRECISION, INTERPRET), mask=m_v)


@jit
def _column_free(q, k, a, b, tok, m_row, o_k, i_h, neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at,
                 GROUP: tl.constexpr, DK: tl.constexpr, DK_PAD: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """What the reverse walk takes of a chunk that no value column changes: c, its last row, and as the products'
    operands the decayed keys e^{c_C - c} k, the keys and the queries (the scores from them: `_scores`)."""
    kn, g, beta = _keys(k, a, b, tok, m_row, o_k, i_h // GROUP, i_h, neg_a, bias, stride_kt, stride_kh, stride_at, DK, DK_PAD)
    c = tl.cumsum(g, 0)
    c_last = _last(c, C)
    # The keys and queries enter products alone from here: held as the products' operands (bf16 with bf16
    # products, half the registers of the fp32 tiles, which spilled beside the state), the same values.
    decayed = _operand(kn * tl.exp(c_last - c)[:, None], PRECISION, INTERPRET)
    kn = _operand(kn, PRECISION, INTERPRET)
    qn = _operand(_queries(q, tok, m_row, o_k, i_h // GROUP, q_scale, stride_qt, stride_qh, DK, DK_PAD), PRECISION, INTERPRET)
    return c, c_last, decayed, kn, qn


@jit
def _scores(qn, kn, c, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """P = q kᵀ ∘ E on and below the diagonal (fp32)."""
    return _dot(qn, tl.trans(kn), PRECISION, INTERPRET) * _decays(c, C, False)


@jit(do_not_specialize=["q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_at"])
def gdn_bwd_walk_inputs_kernel(q, k, a, b, a_log, dt_bias, c_buf, decayed_buf, qn_buf, scores_buf, chunk_first, chunk_len, q_scale,
                               stride_qt, stride_qh, stride_kt, stride_kh, stride_at, GROUP: tl.constexpr, HV: tl.constexpr,
                               DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr,
                               INTERPRET: tl.constexpr):
    """What the walks take of a chunk that no value column changes, a program per (chunk, value head): c by chunk
    row (rows past the run hold its last value), the decayed keys e^{c_C - c} k, the queries (stored by a key
    head's first value head) and the scores q kᵀ ∘ E on and below the diagonal, the last three as the walks'
    product operands. Computed in every program of a walk, at every chunk, they sat on its serial chain."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    n = tl.load(chunk_len + i_n)
    if n > 0:  # a chunk of no rows (runs.pieces makes none) computes nothing
        rows = tl.arange(0, C)
        o_k = tl.arange(0, DK_PAD)
        m_row = rows < n
        m_bk = _rows_mask(m_row, o_k < DK, DK == DK_PAD)
        tok = tl.load(chunk_first + i_n).to(tl.int64) + rows
        neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
        c, _, decayed, kn, qn = _column_free(q, k, a, b, tok, m_row, o_k, i_h, neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt,
                                             stride_kh, stride_at, GROUP, DK, DK_PAD, C, PRECISION, INTERPRET)
        tl.store(c_buf + (i_n.to(tl.int64) * C + rows) * HV + i_h, c)
        p = tok * HV + i_h
        tl.store(decayed_buf + p[:, None] * DK + o_k[None, :], decayed.to(decayed_buf.dtype.element_ty), mask=m_bk)
        if i_h % GROUP == 0:
            tl.store(qn_buf + (tok * (HV // GROUP) + i_h // GROUP)[:, None] * DK + o_k[None, :], qn.to(qn_buf.dtype.element_ty), mask=m_bk)
        scores = _scores(qn, kn, c, C, PRECISION, INTERPRET)
        tl.store(scores_buf + (i_n.to(tl.int64) * HV + i_h) * (C * C) + rows[:, None] * C + rows[None, :], scores.to(scores_buf.dtype.element_ty))


@jit
def _forward_step(k, a, b, w_buf, u_buf, states, delta_buf, c_buf, decayed_buf, t0, n, chunk0, j, s, i_h, i_v, neg_a, bias, stride_kt,
                  stride_kh, stride_at, GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr,
                  BV: tl.constexpr, C: tl.constexpr, INPUTS: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Chunk j of the forward walk from S at its start: S stored, δ = U - W S of its rows; returns the next chunk's S."""
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    tl.store(states + ((chunk0 + j) * HV + i_h) * (DK * DV) + o_k[:, None] * DV + o_v[None, :], s.to(states.dtype.element_ty),
             mask=m_k[:, None] & m_v[None, :])
    m_row = rows < n - j * C
    tok = t0 + j * C + rows
    # Computed, the statements keep the order they had before WALK_INPUTS (the registers and spills timed).
    if INPUTS:
        c = tl.load(c_buf + ((chunk0 + j) * C + rows) * HV + i_h)
        decayed = _stored(tl.load(decayed_buf + (tok * HV + i_h)[:, None] * DK + o_k[None, :], mask=_rows_mask(m_row, m_k, DK == DK_PAD),
                                  other=0.0), INTERPRET)
    else:
        kn, g, beta = _keys(k, a, b, tok, m_row, o_k, i_h // GROUP, i_h, neg_a, bias, stride_kt, stride_kh, stride_at, DK, DK_PAD)
        c = tl.cumsum(g, 0)
    p = tok * HV + i_h
    w = _stored(tl.load(w_buf + p[:, None] * DK + o_k[None, :], mask=_rows_mask(m_row, m_k, DK == DK_PAD), other=0.0), INTERPRET)
    m_cv = _rows_mask(m_row, m_v, DV % BV == 0)
    delta = tl.load(u_buf + p[:, None] * DV + o_v[None, :], mask=m_cv, other=0.0) - _dot(w, s, PRECISION, INTERPRET)
    tl.store(delta_buf + p[:, None] * DV + o_v[None, :], delta.to(delta_buf.dtype.element_ty), mask=m_cv)
    c_last = _last(c, C)
    if not INPUTS:
        decayed = kn * tl.exp(c_last - c)[:, None]
    return tl.exp(c_last) * s + _dot(tl.trans(decayed), delta, PRECISION, INTERPRET)


@jit
def _forward_walk(k, a, b, a_log, dt_bias, w_buf, u_buf, states, delta_buf, c_buf, decayed_buf, run_first, run_len, run_chunk0, i_r, i_h, i_v,
                  stride_kt, stride_kh, stride_at, GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                  DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, INPUTS: tl.constexpr, STAGES: tl.constexpr,
                  PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The forward walk of run i_r, value head i_h and value block i_v: S at every chunk's start (S_0 = 0) and
    δ = U - W S of every row; c and the decayed keys from `gdn_bwd_walk_inputs_kernel`'s buffers where INPUTS.
    STAGES: 0, a `while` over the chunks; else a `for` whose loads Triton pipelines STAGES - 1 chunks ahead."""
    t0, n, chunk0 = tl.load(run_first + i_r).to(tl.int64), tl.load(run_len + i_r), tl.load(run_chunk0 + i_r).to(tl.int64)
    neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
    s = tl.zeros([DK_PAD, BV], dtype=tl.float32)
    if STAGES == 0:
        j = 0
        while j * C < n:
            s = _forward_step(k, a, b, w_buf, u_buf, states, delta_buf, c_buf, decayed_buf, t0, n, chunk0, j, s, i_h, i_v, neg_a, bias,
                              stride_kt, stride_kh, stride_at, GROUP, HV, DK, DV, DK_PAD, BV, C, INPUTS, PRECISION, INTERPRET)
            j += 1
    else:
        for j in tl.range(0, tl.cdiv(n, C), num_stages=STAGES):
            s = _forward_step(k, a, b, w_buf, u_buf, states, delta_buf, c_buf, decayed_buf, t0, n, chunk0, j, s, i_h, i_v, neg_a, bias,
                              stride_kt, stride_kh, stride_at, GROUP, HV, DK, DV, DK_PAD, BV, C, INPUTS, PRECISION, INTERPRET)


@jit
def _reverse_step(q, k, a, b, d_out, w_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf, scores_buf, t0, n, chunk0, j, ds, i_h, i_v,
                  neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at, stride_dt, stride_dh, GROUP: tl.constexpr,
                  HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                  INPUTS: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Chunk j of the reverse walk from dS' at its end: dS' stored, dδ of its rows; returns the chunk before's dS'."""
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    tl.store(dstates + ((chunk0 + j) * HV + i_h) * (DK * DV) + o_k[:, None] * DV + o_v[None, :], ds.to(dstates.dtype.element_ty),
             mask=m_k[:, None] & m_v[None, :])
    m_row = rows < n - j * C
    tok = t0 + j * C + rows
    # Computed, the statements keep the order they had before WALK_INPUTS (the registers and spills timed).
    if INPUTS:
        m_bk = _rows_mask(m_row, m_k, DK == DK_PAD)
        c = tl.load(c_buf + ((chunk0 + j) * C + rows) * HV + i_h)
        c_last = _last(c, C)
        decayed = _stored(tl.load(decayed_buf + (tok * HV + i_h)[:, None] * DK + o_k[None, :], mask=m_bk, other=0.0), INTERPRET)
        q_rows = tok * (HV // GROUP) + i_h // GROUP
        qn = _stored(tl.load(qn_buf + q_rows[:, None] * DK + o_k[None, :], mask=m_bk, other=0.0), INTERPRET)
    else:
        c, c_last, decayed, kn, qn = _column_free(q, k, a, b, tok, m_row, o_k, i_h, neg_a, bias, q_scale, stride_qt, stride_qh,
                                                  stride_kt, stride_kh, stride_at, GROUP, DK, DK_PAD, C, PRECISION, INTERPRET)
    p = tok * HV + i_h
    m_cv = _rows_mask(m_row, m_v, DV % BV == 0)
    d_rows = tl.multiple_of(tok * stride_dt + i_h * stride_dh, 16)
    d_o = tl.load(d_out + d_rows[:, None] + o_v[None, :], mask=m_cv, other=0.0)  # as stored; widened where used
    if INPUTS:
        scores = _stored(tl.load(scores_buf + ((chunk0 + j) * HV + i_h) * (C * C) + rows[:, None] * C + rows[None, :]), INTERPRET)
    else:
        scores = _scores(qn, kn, c, C, PRECISION, INTERPRET)
    d_delta = _dot(tl.trans(scores), d_o.to(tl.float32), PRECISION, INTERPRET) + _dot(decayed, ds, PRECISION, INTERPRET)
    tl.store(d_delta_buf + p[:, None] * DV + o_v[None, :], d_delta.to(d_delta_buf.dtype.element_ty), mask=m_cv)
    w = _stored(tl.load(w_buf + p[:, None] * DK + o_k[None, :], mask=_rows_mask(m_row, m_k, DK == DK_PAD), other=0.0), INTERPRET)
    return tl.exp(c_last) * ds + _dot(tl.trans(qn), tl.exp(c)[:, None] * d_o.to(tl.float32), PRECISION, INTERPRET) \
        - _dot(tl.trans(w), d_delta, PRECISION, INTERPRET)


@jit
def _reverse_walk(q, k, a, b, a_log, dt_bias, d_out, w_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf, scores_buf, run_first, run_len,
                  run_chunk0, i_r, i_h, i_v, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at, stride_dt, stride_dh,
                  GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr,
                  BV: tl.constexpr, C: tl.constexpr, INPUTS: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr,
                  INTERPRET: tl.constexpr):
    """The reverse walk of run i_r, value head i_h and value block i_v: dS' at every chunk's end and dδ of every
    row; dS = e^{c_C} dS' + qᵀ (e^c dO) - Wᵀ dδ. c, the decayed keys, the queries and the scores from
    `gdn_bwd_walk_inputs_kernel`'s buffers where INPUTS; STAGES as `_forward_walk`'s."""
    t0, n, chunk0 = tl.load(run_first + i_r).to(tl.int64), tl.load(run_len + i_r), tl.load(run_chunk0 + i_r).to(tl.int64)
    neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
    ds = tl.zeros([DK_PAD, BV], dtype=tl.float32)
    last = tl.cdiv(n, C) - 1
    if STAGES == 0:
        j = last
        while j >= 0:
            ds = _reverse_step(q, k, a, b, d_out, w_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf, scores_buf, t0, n, chunk0, j, ds,
                               i_h, i_v, neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at, stride_dt,
                               stride_dh, GROUP, HV, DK, DV, DK_PAD, BV, C, INPUTS, PRECISION, INTERPRET)
            j -= 1
    else:
        for i in tl.range(0, last + 1, num_stages=STAGES):
            ds = _reverse_step(q, k, a, b, d_out, w_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf, scores_buf, t0, n, chunk0,
                               last - i, ds, i_h, i_v, neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at,
                               stride_dt, stride_dh, GROUP, HV, DK, DV, DK_PAD, BV, C, INPUTS, PRECISION, INTERPRET)


_WALK_SCALARS = ["q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_at", "stride_dt", "stride_dh"]


@jit(do_not_specialize=["stride_kt", "stride_kh", "stride_at"])
def gdn_bwd_states_kernel(k, a, b, a_log, dt_bias, w_buf, u_buf, states, delta_buf, c_buf, decayed_buf, run_first, run_len, run_chunk0,
                          stride_kt, stride_kh, stride_at, GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                          DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, INPUTS: tl.constexpr, STAGES: tl.constexpr,
                          PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The forward walk alone, a program per (run, value head, block of value columns)."""
    _forward_walk(k, a, b, a_log, dt_bias, w_buf, u_buf, states, delta_buf, c_buf, decayed_buf, run_first, run_len, run_chunk0,
                  tl.program_id(0), tl.program_id(1), tl.program_id(2), stride_kt, stride_kh, stride_at, GROUP, HV, DK, DV, DK_PAD, BV, C,
                  INPUTS, STAGES, PRECISION, INTERPRET)


@jit(do_not_specialize=_WALK_SCALARS)
def gdn_bwd_dstates_kernel(q, k, a, b, a_log, dt_bias, d_out, w_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf, scores_buf, run_first,
                           run_len, run_chunk0, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at, stride_dt, stride_dh,
                           GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr,
                           BV: tl.constexpr, C: tl.constexpr, INPUTS: tl.constexpr, STAGES: tl.constexpr, PRECISION: tl.constexpr,
                           INTERPRET: tl.constexpr):
    """The reverse walk alone, the same grid."""
    _reverse_walk(q, k, a, b, a_log, dt_bias, d_out, w_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf, scores_buf, run_first, run_len,
                  run_chunk0, tl.program_id(0), tl.program_id(1), tl.program_id(2), q_scale, stride_qt, stride_qh, stride_kt, stride_kh,
                  stride_at, stride_dt, stride_dh, GROUP, HV, DK, DV, DK_PAD, BV, C, INPUTS, STAGES, PRECISION, INTERPRET)


@jit(do_not_specialize=_WALK_SCALARS)
def gdn_bwd_walks_kernel(q, k, a, b, a_log, dt_bias, d_out, w_buf, u_buf, states, delta_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf,
                         scores_buf, run_first, run_len, run_chunk0, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at,
                         stride_dt, stride_dh, NV: tl.constexpr, GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                         DV: tl.constexpr, DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, INPUTS: tl.constexpr,
                         STAGES: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Both walks in one launch, a program per (run, value head, walk and block of value columns): the first NV
    blocks walk forward, the next NV backward. Neither reads what the other writes (the reverse chain needs W and
    dO, not S or δ), so they run side by side where one launch of either would leave SMs idle."""
    i_r, i_h, i_w = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if i_w < NV:
        _forward_walk(k, a, b, a_log, dt_bias, w_buf, u_buf, states, delta_buf, c_buf, decayed_buf, run_first, run_len, run_chunk0, i_r, i_h,
                      i_w, stride_kt, stride_kh, stride_at, GROUP, HV, DK, DV, DK_PAD, BV, C, INPUTS, STAGES, PRECISION, INTERPRET)
    else:
        _reverse_walk(q, k, a, b, a_log, dt_bias, d_out, w_buf, dstates, d_delta_buf, c_buf, decayed_buf, qn_buf, scores_buf, run_first,
                      run_len, run_chunk0, i_r, i_h, i_w - NV, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at, stride_dt,
                      stride_dh, GROUP, HV, DK, DV, DK_PAD, BV, C, INPUTS, STAGES, PRECISION, INTERPRET)


@jit
def _chunk_tokens(chunk_first, chunk_len, i_n, i_h, HV: tl.constexpr, C: tl.constexpr):
    """Chunk i_n's tokens, row mask and rows of the per-token buffers."""
    rows = tl.arange(0, C)
    tok = tl.load(chunk_first + i_n).to(tl.int64) + rows
    return tok, rows < tl.load(chunk_len + i_n), tok * HV + i_h


@jit
def _chunk_keys(k, a, b, a_log, dt_bias, tok, m_row, i_h, stride_kt, stride_kh, stride_at, GROUP: tl.constexpr, DK: tl.constexpr,
                DK_PAD: tl.constexpr):
    """The chunk's normalised keys, β and decay cumsum c."""
    neg_a, bias = -tl.exp(tl.load(a_log + i_h).to(tl.float32)), tl.load(dt_bias + i_h).to(tl.float32)
    kn, g, beta = _keys(k, a, b, tok, m_row, tl.arange(0, DK_PAD), i_h // GROUP, i_h, neg_a, bias, stride_kt, stride_kh, stride_at, DK,
                        DK_PAD)
    return kn, beta, tl.cumsum(g, 0)


@jit
def _value_products(d_out, states, dstates, delta_buf, d_delta_buf, tok, m_row, p, i_n, i_h, stride_dt, stride_dh, HV: tl.constexpr,
                    DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                    PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The chunk's products with the state and the outputs, summed over the value blocks: dO δᵀ, dO Sᵀ, dW = -dδ Sᵀ,
    δ dS'ᵀ and Σ S ∘ dS'. Run before the chunk's keys and queries are loaded, which it does not need: they would
    hold 64 registers a thread through the loop (it spilled with them)."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    o_k = tl.arange(0, DK_PAD)
    m_k = o_k < DK
    d_rows = tl.multiple_of(tok * stride_dt + i_h * stride_dh, 16)
    p_state = (i_n.to(tl.int64) * HV + i_h) * (DK * DV) + o_k[:, None] * DV
    d_p = tl.zeros([C, C], dtype=tl.float32)
    d_o_s = tl.zeros([C, DK_PAD], dtype=tl.float32)
    d_w = tl.zeros([C, DK_PAD], dtype=tl.float32)
    d_decayed = tl.zeros([C, DK_PAD], dtype=tl.float32)
    s_ds = 0.0
    for i_v in range(NV):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < DV
        m_state = m_k[:, None] & m_v[None, :]
        m_cv = _rows_mask(m_row, m_v, DV % BV == 0)
        s = _stored(tl.load(states + p_state + o_v[None, :], mask=m_state, other=0.0), INTERPRET)
        ds = _stored(tl.load(dstates + p_state + o_v[None, :], mask=m_state, other=0.0), INTERPRET)
        delta = _stored(tl.load(delta_buf + p[:, None] * DV + o_v[None, :], mask=m_cv, other=0.0), INTERPRET)
        d_delta = _stored(tl.load(d_delta_buf + p[:, None] * DV + o_v[None, :], mask=m_cv, other=0.0), INTERPRET)
        d_o = tl.load(d_out + d_rows[:, None] + o_v[None, :], mask=m_cv, other=0.0).to(tl.float32)
        d_p += _dot(d_o, tl.trans(delta), PRECISION, INTERPRET)
        d_o_s += _dot(d_o, tl.trans(s), PRECISION, INTERPRET)
        d_w -= _dot(d_delta, tl.trans(s), PRECISION, INTERPRET)
        d_decayed += _dot(delta, tl.trans(ds), PRECISION, INTERPRET)
        s_ds += tl.sum(tl.sum(s.to(tl.float32) * ds.to(tl.float32), 1), 0)
    return d_p, d_o_s, d_w, d_decayed, s_ds


@jit
def _grads_through_outputs(q, dq, tok, m_row, p, kn, c, d_p, d_o_s, d_decayed, s_ds, i_h, q_scale, stride_qt, stride_qh,
                           GROUP: tl.constexpr, DK: tl.constexpr, DK_PAD: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr,
                           INTERPRET: tl.constexpr):
    """The chunk's gradients through o = e^c (q S) + P δ and S' = e^{c_C} S + (e^{c_C - c} k)ᵀ δ from
    `_value_products`: stores dq (of the normalised queries, this value head's share) and returns the shares of
    dk and dc."""
    rows = tl.arange(0, C)
    o_k = tl.arange(0, DK_PAD)
    m_k = o_k < DK
    c_last = _last(c, C)
    e_c, decay_k = tl.exp(c), tl.exp(c_last - c)
    # The next chunk's start state first, so that d_decayed's registers are free before the queries load.
    d_kn = decay_k[:, None] * d_decayed
    t_j = decay_k * tl.sum(kn * d_decayed, 1)
    qn = _queries(q, tok, m_row, o_k, i_h // GROUP, q_scale, stride_qt, stride_qh, DK, DK_PAD)
    # P = q kᵀ ∘ E on and below the diagonal.
    d_scores = d_p * _decays(c, C, False)
    d_qn = _dot(d_scores, kn, PRECISION, INTERPRET) + e_c[:, None] * d_o_s
    tl.store(dq + p[:, None] * DK + o_k[None, :], d_qn, mask=_rows_mask(m_row, m_k, DK == DK_PAD))
    d_c = e_c * tl.sum(d_o_s * qn, 1)
    d_kn += _dot(tl.trans(d_scores), qn, PRECISION, INTERPRET)
    d_e = d_scores * _dot(qn, tl.trans(kn), PRECISION, INTERPRET)
    d_c += tl.sum(d_e, 1) - tl.sum(d_e, 0)
    d_c += tl.where(rows == C - 1, tl.exp(c_last) * s_ds + tl.sum(t_j, 0), 0.0) - t_j
    return d_kn, d_c


@jit
def _grads_through_wy(v, a, b, a_log, dt_bias, t_buf, d_delta_buf, dk, dv, da, db, da_log, tok, m_row, p, kn, beta, c, d_w, d_c,
                      i_n, i_h, stride_vt, stride_vh, stride_at, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                      DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The rest: through δ = T Y - T X S and T = (I + A)^-1 into A = β (k kᵀ ∘ E), X = β e^c k and Y = β v;
    adds to dk (which holds the share through the outputs: the normalised keys', this value head's) and stores
    it, dv, and the gates' gradients: da and db, and each token's term of dA_log."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    rows = tl.arange(0, C)
    o_k = tl.arange(0, DK_PAD)
    e_c = tl.exp(c)
    inverse = _stored(tl.load(t_buf + (i_n.to(tl.int64) * HV + i_h) * (C * C) + rows[:, None] * C + rows[None, :]), INTERPRET)
    d_t = _dot(d_w, tl.trans((beta * e_c)[:, None] * kn), PRECISION, INTERPRET)
    d_beta = tl.zeros([C], dtype=tl.float32)
    v_rows = tl.multiple_of(tok * stride_vt + i_h * stride_vh, 16)
    for i_v in range(NV):
        o_v = i_v * BV + tl.arange(0, BV)
        m_cv = _rows_mask(m_row, o_v < DV, DV % BV == 0)
        d_delta = _stored(tl.load(d_delta_buf + p[:, None] * DV + o_v[None, :], mask=m_cv, other=0.0), INTERPRET)
        vf = tl.load(v + v_rows[:, None] + o_v[None, :], mask=m_cv, other=0.0).to(tl.float32)
        d_y = _dot(tl.trans(inverse), d_delta, PRECISION, INTERPRET)
        tl.store(dv + p[:, None] * DV + o_v[None, :], (beta[:, None] * d_y).to(dv.dtype.element_ty), mask=m_cv)
        d_beta += tl.sum(d_y * vf, 1)
        d_t += _dot(d_delta, tl.trans(beta[:, None] * vf), PRECISION, INTERPRET)
    d_x = _dot(tl.trans(inverse), d_w, PRECISION, INTERPRET)
    # dA ∘ E: zero on and above the diagonal.
    d_a = -_dot(tl.trans(inverse), _dot(d_t, tl.trans(inverse), PRECISION, INTERPRET), PRECISION, INTERPRET) * _decays(c, C, True)
    gram = _dot(kn, tl.trans(kn), PRECISION, INTERPRET)
    d_gram = d_a * beta[:, None]
    # dk's share through the outputs, stored in dk by the caller: loaded here, not held through the loop above.
    m_rk = _rows_mask(m_row, o_k < DK, DK == DK_PAD)
    d_kn = tl.load(dk + p[:, None] * DK + o_k[None, :], mask=m_rk, other=0.0)
    d_kn += _dot(d_gram, kn, PRECISION, INTERPRET) + _dot(tl.trans(d_gram), kn, PRECISION, INTERPRET)
    x_dot = tl.sum(d_x * kn, 1)
    d_beta += tl.sum(d_a * gram, 1) + e_c * x_dot
    d_kn += (beta * e_c)[:, None] * d_x
    d_c += beta * e_c * x_dot
    d_e = d_gram * gram
    d_c += tl.sum(d_e, 1) - tl.sum(d_e, 0)
    tl.store(dk + p[:, None] * DK + o_k[None, :], d_kn, mask=m_rk)
    # The gates: g = -e^{A_log} softplus(a + dt_bias), β = sigmoid(b); dg = the reverse cumsum of dc.
    d_g = tl.cumsum(d_c, 0, reverse=True)
    x = tl.load(a + tok * stride_at + i_h, mask=m_row, other=0.0).to(tl.float32) + tl.load(dt_bias + i_h).to(tl.float32)
    rate = tl.exp(tl.load(a_log + i_h).to(tl.float32))
    big = x > SOFTPLUS_THRESHOLD
    softplus = tl.where(big, x, tl.log(1.0 + tl.exp(tl.where(big, 0.0, x))))
    tl.store(da + p, -rate * tl.where(big, 1.0, 1.0 / (1.0 + tl.exp(-x))) * d_g, mask=m_row)
    tl.store(db + p, d_beta * beta * (1.0 - beta), mask=m_row)
    tl.store(da_log + p, -rate * softplus * d_g, mask=m_row)


@jit(do_not_specialize=["q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at",
                        "stride_dt", "stride_dh"])
def gdn_bwd_chunk_kernel(q, k, v, a, b, a_log, dt_bias, d_out, t_buf, states, dstates, delta_buf, d_delta_buf, dq, dk, dv, da, db, da_log,
                         chunk_first, chunk_len, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at,
                         stride_dt, stride_dh, GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                         DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """One chunk's gradients from its S, dS', δ and dδ: every chunk in parallel, the value blocks in a loop."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    if tl.load(chunk_len + i_n) > 0:  # a chunk of no rows (runs.pieces makes none) computes nothing
        tok, m_row, p = _chunk_tokens(chunk_first, chunk_len, i_n, i_h, HV, C)
        d_p, d_o_s, d_w, d_decayed, s_ds = _value_products(d_out, states, dstates, delta_buf, d_delta_buf, tok, m_row, p, i_n, i_h, stride_dt,
                                                           stride_dh, HV, DK, DV, DK_PAD, BV, C, PRECISION, INTERPRET)
        kn, beta, c = _chunk_keys(k, a, b, a_log, dt_bias, tok, m_row, i_h, stride_kt, stride_kh, stride_at, GROUP, DK, DK_PAD)
        d_kn, d_c = _grads_through_outputs(q, dq, tok, m_row, p, kn, c, d_p, d_o_s, d_decayed, s_ds, i_h, q_scale, stride_qt, stride_qh,
                                           GROUP, DK, DK_PAD, C, PRECISION, INTERPRET)
        tl.store(dk + p[:, None] * DK + tl.arange(0, DK_PAD)[None, :], d_kn, mask=_rows_mask(m_row, tl.arange(0, DK_PAD) < DK, DK == DK_PAD))
        tl.debug_barrier()  # _grads_through_wy reads it back, its elements perhaps in other threads: the CTA's stores first
        _grads_through_wy(v, a, b, a_log, dt_bias, t_buf, d_delta_buf, dk, dv, da, db, da_log, tok, m_row, p, kn, beta, c, d_w, d_c,
                          i_n, i_h, stride_vt, stride_vh, stride_at, HV, DK, DV, DK_PAD, BV, C, PRECISION, INTERPRET)


@jit(do_not_specialize=["q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_at", "stride_dt", "stride_dh"])
def gdn_bwd_outputs_kernel(q, k, a, b, a_log, dt_bias, d_out, states, dstates, delta_buf, d_delta_buf, dq, d_w_buf, d_kn_buf, d_c_buf,
                           chunk_first, chunk_len, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_at, stride_dt, stride_dh,
                           GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr,
                           BV: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """`gdn_bwd_chunk_kernel`'s first half as a kernel of its own (SPLIT): its dW and shares of dk and dc stored."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    if tl.load(chunk_len + i_n) > 0:  # a chunk of no rows (runs.pieces makes none) computes nothing
        tok, m_row, p = _chunk_tokens(chunk_first, chunk_len, i_n, i_h, HV, C)
        d_p, d_o_s, d_w, d_decayed, s_ds = _value_products(d_out, states, dstates, delta_buf, d_delta_buf, tok, m_row, p, i_n, i_h, stride_dt,
                                                           stride_dh, HV, DK, DV, DK_PAD, BV, C, PRECISION, INTERPRET)
        o_k = tl.arange(0, DK_PAD)
        m_kout = _rows_mask(m_row, o_k < DK, DK == DK_PAD)
        tl.store(d_w_buf + p[:, None] * DK + o_k[None, :], d_w.to(d_w_buf.dtype.element_ty), mask=m_kout)  # before the keys: its registers go
        kn, beta, c = _chunk_keys(k, a, b, a_log, dt_bias, tok, m_row, i_h, stride_kt, stride_kh, stride_at, GROUP, DK, DK_PAD)
        d_kn, d_c = _grads_through_outputs(q, dq, tok, m_row, p, kn, c, d_p, d_o_s, d_decayed, s_ds, i_h, q_scale, stride_qt, stride_qh,
                                           GROUP, DK, DK_PAD, C, PRECISION, INTERPRET)
        tl.store(d_kn_buf + p[:, None] * DK + o_k[None, :], d_kn, mask=m_kout)
        # Every row, by chunk row (a padded row's dc reaches the run's last row; its token is the next run's).
        tl.store(d_c_buf + (i_n.to(tl.int64) * C + tl.arange(0, C)) * HV + i_h, d_c)


@jit(do_not_specialize=["stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at"])
def gdn_bwd_wy_grads_kernel(k, v, a, b, a_log, dt_bias, t_buf, d_delta_buf, d_w_buf, d_c_buf, dk, dv, da, db, da_log,
                            chunk_first, chunk_len, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, GROUP: tl.constexpr,
                            HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                            PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """`gdn_bwd_chunk_kernel`'s second half as a kernel of its own (SPLIT); dk holds the first half's share."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    if tl.load(chunk_len + i_n) > 0:  # a chunk of no rows (runs.pieces makes none) computes nothing
        tok, m_row, p = _chunk_tokens(chunk_first, chunk_len, i_n, i_h, HV, C)
        kn, beta, c = _chunk_keys(k, a, b, a_log, dt_bias, tok, m_row, i_h, stride_kt, stride_kh, stride_at, GROUP, DK, DK_PAD)
        o_k = tl.arange(0, DK_PAD)
        m_kout = _rows_mask(m_row, o_k < DK, DK == DK_PAD)
        d_w = _stored(tl.load(d_w_buf + p[:, None] * DK + o_k[None, :], mask=m_kout, other=0.0), INTERPRET)
        d_c = tl.load(d_c_buf + (i_n.to(tl.int64) * C + tl.arange(0, C)) * HV + i_h)
        _grads_through_wy(v, a, b, a_log, dt_bias, t_buf, d_delta_buf, dk, dv, da, db, da_log, tok, m_row, p, kn, beta, c, d_w, d_c,
                          i_n, i_h, stride_vt, stride_vh, stride_at, HV, DK, DV, DK_PAD, BV, C, PRECISION, INTERPRET)


@jit(do_not_specialize=["num_tokens", "scale", "stride_xt", "stride_xh"])
def gdn_bwd_norms_kernel(x, d_xn, dx, num_tokens, scale, stride_xt, stride_xh, GROUP: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr,
                         DK_PAD: tl.constexpr, BT: tl.constexpr):
    """dx of xn = scale x / sqrt(Σ x² + eps) for BT tokens of key head i_kh, dxn summed over its GROUP value heads."""
    i_t, i_kh = tl.program_id(0), tl.program_id(1)
    tok = (i_t * BT + tl.arange(0, BT)).to(tl.int64)
    o_k = tl.arange(0, DK_PAD)
    m = (tok < num_tokens)[:, None] & (o_k < DK)[None, :]
    xf = tl.load(x + tok[:, None] * stride_xt + i_kh * stride_xh + o_k[None, :], mask=m, other=0.0).to(tl.float32)
    d = tl.zeros([BT, DK_PAD], dtype=tl.float32)
    for j in range(GROUP):
        d += tl.load(d_xn + ((tok * (HK * GROUP) + i_kh * GROUP + j) * DK)[:, None] + o_k[None, :], mask=m, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, 1) + L2_EPS)
    out = scale * (r[:, None] * d - (r * r * r * tl.sum(xf * d, 1))[:, None] * xf)
    tl.store(dx + (tok[:, None] * HK + i_kh) * DK + o_k[None, :], out.to(dx.dtype.element_ty), mask=m)


# The backward's own tiles (its bits are nobody's contract), chosen by benchmarks/profile_gdn_bwd.py --sweep on
# the H200 at heads of 128: chunks of CHUNK rows, blocks of BLOCK_V value columns, NUM_WARPS warps a program of
# T/W/U and of the walks (4: 13% less step time than 8 at 8 x 2048 tokens, the same at 2 x 4096), CHUNK_WARPS
# for the chunks' gradients, loads not pipelined (NUM_STAGES 1: the chunk kernel's loop over value blocks,
# pipelined, asks for more than sm_90's 227 KB of shared memory at chunks of 64). Chunks of 64 need
# BLOCK_V >= 64: with 32, Triton 3.6's sm_90 code computes wrong values and faults (as gdn.core.triton's
# forward does with such a pair).
CHUNK, BLOCK_V, NUM_WARPS, CHUNK_WARPS, NUM_STAGES = 64, 64, 4, 8, 1
# SPLIT: the chunks' gradients as two kernels (dW and the shares of dk and dc through memory), 2-6% faster
# than the one kernel, which spills more. NORM_TOKENS: tokens a program of the norms' backward.
SPLIT, NORM_TOKENS = True, 16
# ONE_WALK_LAUNCH: both walks in one launch (`gdn_bwd_walks_kernel`), side by side, where two launches ran them in
# turn; the same programs, so the same bits. ISOEXEC_GDN_BWD_WALKS=two launches them in turn for a process (`one`,
# the default, together).
_WALKS = os.environ.get("ISOEXEC_GDN_BWD_WALKS", "") or "one"
if _WALKS not in ("one", "two"):
    raise EnvError(f"ISOEXEC_GDN_BWD_WALKS must be 'one' or 'two', got {_WALKS!r}")
ONE_WALK_LAUNCH = _WALKS == "one"
# WALK_BLOCK_V: the walks' own block of value columns, None for BLOCK_V. The walks are the step's serial chains and
# have a program per (run, value head, block), so few runs x heads leave SMs idle at 64 columns; the chunk kernels
# have a program per (chunk, value head) whatever the block. ISOEXEC_GDN_BWD_WALK_BLOCK_V=n sets it for a process.
_WALK_BLOCK = os.environ.get("ISOEXEC_GDN_BWD_WALK_BLOCK_V", "")
if _WALK_BLOCK and not (_WALK_BLOCK.isdigit() and int(_WALK_BLOCK) >= 16 and not int(_WALK_BLOCK) & (int(_WALK_BLOCK) - 1)):
    raise EnvError(f"ISOEXEC_GDN_BWD_WALK_BLOCK_V must be a power of two >= 16, got {_WALK_BLOCK!r}")
WALK_BLOCK_V: int | None = int(_WALK_BLOCK) if _WALK_BLOCK else None
# WALK_INPUTS: what the walks take of a chunk that no value column changes (c, the decayed keys, the queries, the
# scores) computed for every chunk at once (`gdn_bwd_walk_inputs_kernel`) and loaded by the walks, where each walk's
# program computed them at every chunk on its serial chain: more memory traffic, a shorter chain.
# ISOEXEC_GDN_BWD_WALK_INPUTS=1 (or 0) sets it for a process.
WALK_INPUTS: bool = switch("ISOEXEC_GDN_BWD_WALK_INPUTS", False)
# WALK_STAGES: 0, the walks step through their chunks in a `while`, each chunk's loads waiting at its start;
# n >= 2, a `for` that Triton software-pipelines, the next n - 1 chunks' tiles loaded into shared memory while a
# chunk computes (none of a walk's loads depends on its chain; the interpreter runs the `for` unpipelined).
# ISOEXEC_GDN_BWD_WALK_STAGES=n sets it for a process.
_STAGES = os.environ.get("ISOEXEC_GDN_BWD_WALK_STAGES", "") or "0"
if not _STAGES.isdigit() or int(_STAGES) == 1:
    raise EnvError(f"ISOEXEC_GDN_BWD_WALK_STAGES must be 0 or a whole number >= 2, got {_STAGES!r}")
WALK_STAGES = int(_STAGES)
# BF16_BUFFERS: with bf16 operands, the buffers read back as operands alone are bf16 (gdn_bwd's note): 9-18%
# less step time than fp32 ones, the spills of the chunks' gradients 182 -> 66 registers' worth.
BF16_BUFFERS = True


def gdn_bwd(q, k, v, a, b, a_log, dt_bias, positions, grad: Tensor, precision: str, runs: Runs | None = None) -> tuple[Tensor, ...]:
    """The gradients of gdn_core (a trainer call: no cache) with respect to q, k, v, a, b, A_log, dt_bias; the
    products' operands as the forward's `dot_precision`. `runs`: the runs as the forward found them, or None to
    find them here (a host read)."""
    num_tokens, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    group = num_v_heads // num_k_heads
    device = v.device
    k_pad, v_pad = _padded(k_dim), _padded(v_dim)
    q, k, v, grad = _strided16(q, k_pad), _strided16(k, k_pad), _strided16(v, v_pad), _strided16(grad, v_pad)
    a, b = a.contiguous(), b.contiguous()
    a_log, dt_bias = a_log.contiguous(), dt_bias.contiguous()
    chunk = CHUNK
    if chunk == 64 and BLOCK_V < 64:
        raise ValueError(f"gdn.core.triton's backward: chunks of 64 need BLOCK_V >= 64, got {BLOCK_V}")
    if runs is None:
        runs = find_runs(positions, None)
    # Chunks from each run's first token (this pass's own chunks: any chunk size computes the same function).
    (first, length, chunk0, _, chunk_first, _, chunk_len), num_chunks = pieces(runs, chunk, num_tokens, from_offsets=False)
    block_v, walk_block = min(BLOCK_V, v_pad), min(WALK_BLOCK_V or BLOCK_V, v_pad)
    runs = (first.shape[0], num_v_heads, cdiv(v_dim, walk_block))
    chunks = (num_chunks, num_v_heads)
    dims = dict(GROUP=group, HV=num_v_heads, DK=k_dim, DV=v_dim, DK_PAD=k_pad, C=chunk, PRECISION=PRECISIONS[precision],
                INTERPRET=triton_support.interpreting(), num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    chunk_dims = {**dims, "num_warps": CHUNK_WARPS}
    f32 = dict(dtype=torch.float32, device=device)
    # T, W, the states, δ, dS', dδ and dW are read back as products' operands alone (the one elementwise use,
    # Σ S ∘ dS' for the last row's dc, takes them as stored): with bf16 operands they are stored as bf16, which
    # rounds them as the operand would, for half the traffic and registers.
    ops = dict(dtype=torch.bfloat16 if precision == "bf16" and BF16_BUFFERS else torch.float32, device=device)
    q_scale = float(k_dim**-0.5)
    qs, ks, vs, ats, ds = (q.stride(0), q.stride(1)), (k.stride(0), k.stride(1)), (v.stride(0), v.stride(1)), a.stride(0), \
        (grad.stride(0), grad.stride(1))

    t_buf = torch.empty(num_chunks, num_v_heads, chunk, chunk, **ops)
    w_buf = torch.empty(num_tokens, num_v_heads, k_dim, **ops)
    u_buf = torch.empty(num_tokens, num_v_heads, v_dim, **f32)
    gdn_bwd_wy_kernel[chunks](k, v, a, b, a_log, dt_bias, t_buf, w_buf, u_buf, chunk_first, chunk_len, *ks, *vs, ats, DV_PAD=v_pad,
                              SUB=SUB, **dims)
    states = torch.empty(num_chunks, num_v_heads, k_dim, v_dim, **ops)
    # δ overwrites U row by row where both are fp32: a walk reads a chunk's U before it stores that chunk's δ.
    delta = u_buf if ops["dtype"] == torch.float32 else torch.empty(num_tokens, num_v_heads, v_dim, **ops)
    dstates = torch.empty(num_chunks, num_v_heads, k_dim, v_dim, **ops)
    d_delta = torch.empty(num_tokens, num_v_heads, v_dim, **ops)
    if WALK_INPUTS:
        walk_inputs = (torch.empty(num_chunks * chunk, num_v_heads, **f32), torch.empty(num_tokens, num_v_heads, k_dim, **ops),
                       torch.empty(num_tokens, num_k_heads, k_dim, **ops), torch.empty(num_chunks, num_v_heads, chunk, chunk, **ops))
        gdn_bwd_walk_inputs_kernel[chunks](q, k, a, b, a_log, dt_bias, *walk_inputs, chunk_first, chunk_len, q_scale, *qs, *ks, ats, **dims)
    else:
        walk_inputs = (w_buf,) * 4  # pointers the walks never read
    walk_dims = dict(dims, BV=walk_block, INPUTS=WALK_INPUTS, STAGES=WALK_STAGES)
    if ONE_WALK_LAUNCH:
        gdn_bwd_walks_kernel[runs[:2] + (2 * runs[2],)](q, k, a, b, a_log, dt_bias, grad, w_buf, u_buf, states, delta, dstates, d_delta,
                                                        *walk_inputs, first, length, chunk0, q_scale, *qs, *ks, ats, *ds, NV=runs[2], **walk_dims)
    else:
        gdn_bwd_states_kernel[runs](k, a, b, a_log, dt_bias, w_buf, u_buf, states, delta, *walk_inputs[:2], first, length, chunk0, *ks, ats,
                                    **walk_dims)
        gdn_bwd_dstates_kernel[runs](q, k, a, b, a_log, dt_bias, grad, w_buf, dstates, d_delta, *walk_inputs, first, length, chunk0, q_scale,
                                     *qs, *ks, ats, *ds, **walk_dims)
    dqn = torch.empty(num_tokens, num_v_heads, k_dim, **f32)
    dkn = torch.empty(num_tokens, num_v_heads, k_dim, **f32)
    dv = torch.empty(num_tokens, num_v_heads, v_dim, dtype=v.dtype, device=device)
    da, db, da_log = (torch.empty(num_tokens, num_v_heads, **f32) for _ in range(3))
    if SPLIT:
        d_c = torch.empty(num_chunks * chunk, num_v_heads, **f32)  # by chunk row, padded rows too
        gdn_bwd_outputs_kernel[chunks](q, k, a, b, a_log, dt_bias, grad, states, dstates, delta, d_delta, dqn, w_buf, dkn, d_c, chunk_first,
                                       chunk_len, q_scale, *qs, *ks, ats, *ds, BV=block_v, **chunk_dims)  # dW over W: read by the walks alone
        gdn_bwd_wy_grads_kernel[chunks](k, v, a, b, a_log, dt_bias, t_buf, d_delta, w_buf, d_c, dkn, dv, da, db, da_log, chunk_first,
                                        chunk_len, *ks, *vs, ats, BV=block_v, **chunk_dims)
    else:
        gdn_bwd_chunk_kernel[chunks](q, k, v, a, b, a_log, dt_bias, grad, t_buf, states, dstates, delta, d_delta, dqn, dkn, dv, da, db,
                                     da_log, chunk_first, chunk_len, q_scale, *qs, *ks, *vs, ats, *ds, BV=block_v, **chunk_dims)
    # The l2 norms' backward, the value heads of one key head summed.
    dq = torch.empty(num_tokens, num_k_heads, k_dim, dtype=q.dtype, device=device)
    dk = torch.empty(num_tokens, num_k_heads, k_dim, dtype=k.dtype, device=device)
    norms = (cdiv(num_tokens, NORM_TOKENS), num_k_heads)
    for x, dxn, dx, scale in ((q, dqn, dq, q_scale), (k, dkn, dk, 1.0)):
        gdn_bwd_norms_kernel[norms](x, dxn, dx, num_tokens, scale, x.stride(0), x.stride(1), GROUP=group, HK=num_k_heads, DK=k_dim,
                                    DK_PAD=k_pad, BT=NORM_TOKENS, num_warps=4)
    return dq, dk, dv, da, db, da_log.sum(0), da.sum(0)


SOURCES = (gdn_bwd_wy_kernel, gdn_bwd_walk_inputs_kernel, gdn_bwd_states_kernel, gdn_bwd_dstates_kernel, gdn_bwd_walks_kernel, _forward_walk, _reverse_walk,
           gdn_bwd_chunk_kernel, gdn_bwd_outputs_kernel, gdn_bwd_wy_grads_kernel, gdn_bwd_norms_kernel, _chunk_tokens, _chunk_keys,
           _value_products, _grads_through_outputs, _grads_through_wy, _column_free, _scores, _keys, _queries, _last, _decays, _dot)
