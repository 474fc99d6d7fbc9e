"""gdn.core.triton in two launches, for calls whose runs are long (`triton.py` chooses): `gdn_chunks_kernel` does
every chunk piece's chunk-local work at once (the keys, the inverse, W, U, the queries, the scores, the decayed
keys, by chunk row into buffers), `gdn_walk_kernel` walks each run with the state alone (δ, o and the next S₀
from those buffers) and leaves the slot as the one kernel does.

The rows' bits are the one kernel's: both kernels call its helpers (`triton_tiles.py`) on the same tiles; what a
launch boundary could change is a reduction's layout (its summation order), and compiled for sm_90 the l2 norms'
sums and the cumsum take the one kernel's layouts; buffers read back only as operands hold operands (bf16 with
bf16 products), so the stores round nothing the products would not. tests/ops/gdn/test_triton.py and
benchmarks/gdn_bits.py compare the paths.
"""
from __future__ import annotations

import torch

from .. import triton_support
from ..triton_support import jit, tl
from .runs import pieces
from .triton_tiles import (INVERSES, PRECISIONS, SUB, T_FIELD, _advanced, _decayed, _delta, _in_dtype, _operand, _outputs, _padded, _piece_keys,
                           _piece_queries, _piece_values, _rows_mask, _stored, _values)


@jit
def _walk_tiles(w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, chunk, stop, i_h, o_k, o_v, m_k, m_v, HV: tl.constexpr,
                DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, INTERPRET: tl.constexpr):
    """Chunk piece `chunk`'s rows below `stop` from `gdn_chunks_kernel`'s buffers (zeros past them; none for stop 0):
    W, U (columns o_v), the queries, the scores, c and the decayed keys (read where the piece closes its chunk,
    loaded with the rest so that their latency is off the state's chain too)."""
    rows = tl.arange(0, C)
    below = rows < stop
    p = (chunk * C + rows) * HV + i_h
    m_bk = _rows_mask(below, m_k, DK == DK_PAD)
    w = _stored(tl.load(w_buf + p[:, None] * DK + o_k[None, :], mask=m_bk, other=0.0), INTERPRET)
    u = tl.load(u_buf + p[:, None] * DV + o_v[None, :], mask=_rows_mask(below, m_v, DV % BV == 0), other=0.0)
    qn = _stored(tl.load(qn_buf + p[:, None] * DK + o_k[None, :], mask=m_bk, other=0.0), INTERPRET)
    scores = _stored(tl.load(scores_buf + (chunk * HV + i_h) * (C * C) + rows[:, None] * C + rows[None, :], mask=below[:, None], other=0.0),
                     INTERPRET)
    decayed = _stored(tl.load(decayed_buf + p[:, None] * DK + o_k[None, :], mask=m_bk, other=0.0), INTERPRET)
    return w, u, qn, scores, tl.load(c_buf + p, mask=below, other=0.0), decayed


@jit(do_not_specialize=["has_cache", "q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at"])
def gdn_chunks_kernel(
    q, k, v, a, b, a_log, dt_bias, rows_cache, state_ids, run_first, chunk_run, chunk_tok0, chunk_off, chunk_stop,
    w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, g_buf, beta_buf, t_rows_buf,
    has_cache, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, ROWS: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Chunk piece i_n (offsets [off, stop) from the call, [0, off) from its run's cache slot), value head i_h:
    W, U, the queries, the scores, the decayed keys, c, g and β (and T's rows where ROWS) of every row below `stop`, by
    chunk row."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    width: tl.constexpr = DK_PAD + DV_PAD + 16 + (T_FIELD if ROWS else 0)  # triton_tiles.row_floats
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    stop = tl.load(chunk_stop + i_n)
    if stop > 0:  # a piece of no rows (runs.pieces makes none) computes nothing
        rows = tl.arange(0, C)
        o_k = tl.arange(0, DK_PAD)
        m_k = o_k < DK
        i_kh = i_h // GROUP
        off = tl.load(chunk_off + i_n)
        caching = has_cache != 0
        slot = tl.load(state_ids + tl.load(run_first + tl.load(chunk_run + i_n)), mask=caching, other=0).to(tl.int64)
        tok64 = tl.load(chunk_tok0 + i_n).to(tl.int64) + rows  # the token at each offset (below `off`: none of this call's)
        piece = (rows >= off) & (rows < stop)
        cached = rows < off
        p_cached = rows_cache + slot * (C * HV * width) + i_h * width + rows * (HV * width)
        neg_a = -tl.exp(tl.load(a_log + i_h).to(tl.float32))
        bias = tl.load(dt_bias + i_h).to(tl.float32)
        kf, g, beta, t_rows, kn, c, inverse, w = _piece_keys(k, a, b, p_cached, tok64, piece, piece, cached, o_k, m_k, i_kh, i_h, neg_a, bias,
                                                             stride_kt, stride_kh, stride_at, DK, DK_PAD, DV_PAD, C, SUB, PRECISION, ROWS,
                                                             INTERPRET)
        below = rows < stop
        p = (i_n.to(tl.int64) * C + rows) * HV + i_h  # by chunk row
        m_kout = _rows_mask(below, m_k, DK == DK_PAD)
        tl.store(w_buf + p[:, None] * DK + o_k[None, :], w.to(w_buf.dtype.element_ty), mask=m_kout)
        for i_v in range(NV):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < DV
            vf = _piece_values(v, p_cached, tok64, piece, piece, cached, o_v, m_v, i_h, stride_vt, stride_vh, DK_PAD, DV, BV)
            tl.store(u_buf + p[:, None] * DV + o_v[None, :], _values(inverse, beta, vf, PRECISION, INTERPRET),
                     mask=_rows_mask(below, m_v, DV % BV == 0))
        qn, scores = _piece_queries(q, tok64, piece, piece, o_k, m_k, i_kh, kn, c, q_scale, stride_qt, stride_qh, DK, DK_PAD, C, PRECISION,
                                    INTERPRET)
        tl.store(qn_buf + p[:, None] * DK + o_k[None, :], qn.to(qn_buf.dtype.element_ty), mask=m_kout)
        tl.store(scores_buf + (i_n.to(tl.int64) * HV + i_h) * (C * C) + rows[:, None] * C + rows[None, :], scores.to(scores_buf.dtype.element_ty))
        c_last, decayed = _decayed(kn, c, C, PRECISION, INTERPRET)
        tl.store(decayed_buf + p[:, None] * DK + o_k[None, :], decayed.to(decayed_buf.dtype.element_ty), mask=m_kout)
        tl.store(c_buf + p, c)
        tl.store(g_buf + p, g, mask=piece)
        tl.store(beta_buf + p, beta, mask=piece)
        if ROWS:
            tl.store(t_rows_buf + p[:, None] * C + rows[None, :], t_rows, mask=piece[:, None])


@jit(do_not_specialize=["has_cache", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_ot", "stride_oh"])
def gdn_walk_kernel(
    k, v, out, state, rows_cache, state_ids, positions, run_first, run_len, run_chunk0,
    w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, g_buf, beta_buf, t_rows_buf,
    has_cache, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr, ROWS: tl.constexpr, INTERPRET: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Run i_r, value head i_h, value columns [i_v BV, (i_v + 1) BV): from the slot's state (or zeros), δ = U - W S₀
    and the rows' outputs piece by piece from `gdn_chunks_kernel`'s buffers, S₀ from one chunk to the next; then
    the slot as `gdn_fwd_kernel` leaves it (the state, and an open chunk's inputs). PREFETCH: a piece's tiles are
    loaded while the piece before it computes (their latency off the state's chain, for more registers)."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    width: tl.constexpr = DK_PAD + DV_PAD + 16 + (T_FIELD if ROWS else 0)  # triton_tiles.row_floats
    i_r, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t0, n, chunk0 = tl.load(run_first + i_r), tl.load(run_len + i_r), tl.load(run_chunk0 + i_r).to(tl.int64)
    caching = has_cache != 0
    pos0 = tl.load(positions + t0).to(tl.int32)
    slot = tl.load(state_ids + t0, mask=caching, other=0).to(tl.int64)
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    m_state = m_k[:, None] & m_v[None, :]
    s0 = tl.load(state + slot * (HV * DK * DV) + i_h * (DK * DV) + o_k[:, None] * DV + o_v[None, :],
                 mask=m_state & (pos0 > 0) & caching, other=0.0)  # [DK_PAD, BV]
    off = pos0 % C
    done = 0  # the run's tokens before this piece
    j = 0
    closed = pos0 < 0  # whether a chunk closed in this call
    stop = tl.minimum(off + n, C)
    w, u, qn, scores, c, decayed = _walk_tiles(w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, chunk0, stop, i_h, o_k, o_v, m_k,
                                               m_v, HV, DK, DV, DK_PAD, BV, C, INTERPRET)
    while done < n:
        piece = (rows >= off) & (rows < stop)
        p = ((chunk0 + j) * C + rows) * HV + i_h
        # The next piece: whole chunks from offset 0 after this one (stop 0 past the run).
        next_stop = tl.minimum(tl.maximum(n - done - (stop - off), 0), C)
        if PREFETCH:
            w_next, u_next, qn_next, scores_next, c_next, decayed_next = _walk_tiles(
                w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, chunk0 + j + 1, next_stop, i_h, o_k, o_v, m_k, m_v, HV, DK, DV, DK_PAD,
                BV, C, INTERPRET)
        s_op = _operand(s0, PRECISION, INTERPRET)
        delta = _delta(u, w, s_op, PRECISION, INTERPRET)
        o = _outputs(qn, scores, c, s_op, delta, PRECISION, INTERPRET)
        tok64 = (t0 + done + rows - off).to(tl.int64)
        m_pv = _rows_mask(piece, m_v, DV % BV == 0)
        o_rows = tl.multiple_of(tok64 * stride_ot + i_h * stride_oh, 16)
        tl.store(out + o_rows[:, None] + o_v[None, :], o.to(out.dtype.element_ty), mask=m_pv)
        if stop == C:
            s0 = _advanced(s0, tl.sum(tl.where(rows == C - 1, c, 0.0), 0), decayed, delta, PRECISION, INTERPRET)
            closed = pos0 >= 0
        elif caching:  # the run's last piece leaves its chunk open: its rows' inputs into the slot (k, g, β from the last block)
            p_cached = rows_cache + slot * (C * HV * width) + i_h * width + rows * (HV * width)
            v_rows = tl.multiple_of(tok64 * stride_vt + i_h * stride_vh, 16)
            vf = tl.load(v + v_rows[:, None] + o_v[None, :], mask=m_pv, other=0.0)
            tl.store(_in_dtype(p_cached + DK_PAD, v)[:, None] + o_v[None, :], vf, mask=m_pv)
            keep = piece & (i_v == NV - 1)
            m_pk = _rows_mask(keep, m_k, DK == DK_PAD)
            k_rows = tl.multiple_of(tok64 * stride_kt + (i_h // GROUP) * stride_kh, 16)
            kf = tl.load(k + k_rows[:, None] + o_k[None, :], mask=m_pk, other=0.0)
            tl.store(_in_dtype(p_cached, k)[:, None] + o_k[None, :], kf, mask=m_pk)
            tl.store(p_cached + DK_PAD + DV_PAD, tl.load(g_buf + p, mask=keep, other=0.0), mask=keep)
            tl.store(p_cached + DK_PAD + DV_PAD + 1, tl.load(beta_buf + p, mask=keep, other=0.0), mask=keep)
            if ROWS:
                tl.store(p_cached[:, None] + DK_PAD + DV_PAD + 16 + rows[None, :],
                         tl.load(t_rows_buf + p[:, None] * C + rows[None, :], mask=keep[:, None], other=0.0), mask=keep[:, None])
        done += stop - off
        off -= off
        j += 1
        stop = next_stop
        if PREFETCH:
            w, u, qn, scores, c, decayed = w_next, u_next, qn_next, scores_next, c_next, decayed_next
        else:
            w, u, qn, scores, c, decayed = _walk_tiles(w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, chunk0 + j, stop, i_h, o_k, o_v,
                                                       m_k, m_v, HV, DK, DV, DK_PAD, BV, C, INTERPRET)
    if caching & (closed | (pos0 == 0)):  # the state changed (a chunk closed), or the slot never held this sequence's
        tl.store(state + slot * (HV * DK * DV) + i_h * (DK * DV) + o_k[:, None] * DV + o_v[None, :], s0, mask=m_state)


def fwd(q, k, v, a, b, a_log, dt_bias, out, state, rows, state_ids, positions, runs, has_cache, chunk_size, precision,
        block_v, num_warps, walk_block, prefetch, inverse="products") -> None:
    """`out` (and the cache) of a call in two launches; the tensors as gdn_fwd pads them. `walk_block`: the walk's
    value columns (None: `block_v`); `prefetch`: its tiles loaded a piece ahead; `inverse`: the contract's."""
    num_tokens, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    k_pad, v_pad = _padded(k_dim), _padded(v_dim)
    (first, length, chunk0, chunk_run, tok0, chunk_off, chunk_stop), num_chunks = pieces(runs, chunk_size, num_tokens)
    device = v.device
    # The buffers read back only as products' operands hold them as the operands do (bf16 with bf16 products).
    ops = dict(dtype=torch.bfloat16 if precision == "bf16" else torch.float32, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    chunk_rows = num_chunks * chunk_size
    w_buf, qn_buf, decayed_buf = (torch.empty(chunk_rows, num_v_heads, k_dim, **ops) for _ in range(3))
    u_buf = torch.empty(chunk_rows, num_v_heads, v_dim, **f32)
    scores_buf = torch.empty(num_chunks, num_v_heads, chunk_size, chunk_size, **ops)
    c_buf, g_buf, beta_buf = (torch.empty(chunk_rows, num_v_heads, **f32) for _ in range(3))
    rows_inverse = bool(INVERSES[inverse])
    # T's rows, for the walk to leave an open chunk's in the slot (the inverse by rows alone; else a pointer never read).
    t_rows_buf = torch.empty(chunk_rows, num_v_heads, chunk_size, **f32) if rows_inverse else c_buf
    dims = dict(GROUP=num_v_heads // num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim, DK_PAD=k_pad, DV_PAD=v_pad, BV=block_v, C=chunk_size,
                PRECISION=PRECISIONS[precision], ROWS=rows_inverse, INTERPRET=triton_support.interpreting(), num_warps=num_warps)
    buffers = (w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, g_buf, beta_buf, t_rows_buf)
    gdn_chunks_kernel[(num_chunks, num_v_heads)](
        q, k, v, a, b, a_log, dt_bias, rows, state_ids, first, chunk_run, tok0, chunk_off, chunk_stop, *buffers, int(has_cache),
        float(k_dim**-0.5), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), SUB=SUB, **dims,
    )
    walk_block = min(walk_block or block_v, v_pad)
    gdn_walk_kernel[(first.shape[0], num_v_heads, triton_support.cdiv(v_dim, walk_block))](
        k, v, out, state, rows, state_ids, positions, first, length, chunk0, *buffers, int(has_cache), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), out.stride(0), out.stride(1), PREFETCH=prefetch, **{**dims, "BV": walk_block},
    )

