"""gdn.core by chunk-form rows as one Triton kernel: every row from its absolute chunk's start state and the
chunk's inputs up to itself, by one op sequence in training, prefill chunks and decode (README.md).

One program per (run, value head) walks its run chunk piece by chunk piece, serially (the state chain),
one block of BV value columns after the other; the work inside a chunk is a handful of C-row tensor-core
products, as flash-linear-attention's chunk kernels do it. Every tile has C rows with row r at chunk offset r whatever
the piece computes: a piece that starts mid-chunk (an engine call continuing its sequence) loads the
chunk's earlier inputs from the sequence's cache slot and recomputes those rows exactly as the first call
did, so a decode step runs the trainer's tiles with the rows past it zero. The engine's cache is
therefore the open chunk's *inputs* (k and v as given, g and β as this kernel gated them) and the fp32
state at its start: no intermediate a later call would have to reproduce. A piece that leaves its chunk
open writes its rows into the slot itself, the fields every value block reads (k, g, β) from the last
block, after every block has read the slot's earlier rows: one launch a call.

A chunk piece, for rows r < `stop` (rows past it are zero, finite and never read by a row before them):
1. gates, l2 norms (`tl.sum` over the head dim), the decay cumsum c (`tl.cumsum` over the C rows: a prefix
   scan, so row r's value depends on rows <= r alone);
2. A = β_i (k_i · k_j) exp(c_i - c_j) below the diagonal, one product; T = (I + A)^-1 by block products
   (`_inverse`): every factor lower triangular, so row i of T reads rows <= i of A only;
3. W = T (β e^c k), U = T (β v), δ = U - W S₀, o = e^c (q S₀) + (q kᵀ ∘ decay, j <= i) δ; when the chunk
   closes, S₀ ← e^{c_last} S₀ + (k e^{c_last - c})ᵀ δ.
The products take `dot_precision` (ieee fp32 on the FMA units, tf32 or bf16 operands on the tensor cores,
fp32 accumulation either way; the inverse's take tf32 where the others take bf16). An MMA's element is a
function of its own row and column, and the rows a row does not see are zero or multiplied by an exact
zero, so a row's bits do not depend on the rows after it (a zero's sign may: the output takes +0.0).

A call can also run in two launches (`TWO_LAUNCH_MIN_RUN`): `gdn_chunks_kernel` does every chunk piece's
chunk-local work at once (steps 1, 2 and W, U, the queries, the scores, the decayed keys, by chunk row into
buffers), `gdn_walk_kernel` walks each run with the state alone (δ, o and the next S₀ from those buffers) and
leaves the slot as the one kernel does. Both call the one kernel's helpers on the same tiles; what a launch
boundary could change is a reduction's layout (its summation order), and compiled for sm_90 the l2 norms' sums
and the cumsum take the one kernel's layouts; buffers read back only as operands hold operands (bf16 with bf16
products), so the stores round nothing the products would not.

Each kernel compiles once for every case: nothing that differs between a trainer call and an engine call
is a constexpr or a specialised integer (has_cache, T and the strides are runtime values; the wrapper
hands the kernels 16-byte aligned pointers and strides that are multiples of 16 elements only), because
two compiled variants may lay a tile out differently and reduce it in another order (which is why the
two-launch path's layouts were read, and its bits are tested, rather than assumed). The backward pass
(`triton_bwd.py`) is Triton kernels of its own: correct gradients, not invariant ones.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, torch_dtype
from ..triton_support import jit, needs_grad, next_power_of_2, require_device, tl, triton_available
from .reference import L2_EPS as _L2_EPS
from .reference import SOFTPLUS_THRESHOLD as _SOFTPLUS_THRESHOLD
from .reference import check_inputs, check_runs
from .runs import Runs, find_runs, pieces

ID = "gdn.core.triton"
VERSION = 3
# The reference's constants, as constexprs a kernel may read.
L2_EPS = tl.constexpr(_L2_EPS) if tl is not None else _L2_EPS
SOFTPLUS_THRESHOLD = tl.constexpr(_SOFTPLUS_THRESHOLD) if tl is not None else _SOFTPLUS_THRESHOLD
DTYPES = ("bfloat16", "float32")
PRECISIONS = {"ieee": 0, "tf32": 1, "bf16": 2}
SUB = 16  # rows of the inverse's diagonal blocks: tl.dot's smallest tile


def _padded(dim: int) -> int:
    """A head dim as the kernel tiles it: a power of two >= 16 (tl.dot's smallest tile)."""
    return max(16, next_power_of_2(dim))


def row_width(num_v_heads: int, k_dim: int, v_dim: int) -> int:
    """Floats a cached open-chunk row holds per value head: the inputs k and v as given (in [Dk_pad] and
    [Dv_pad] fields), then g and β, padded to 16 floats so that every field starts 64-byte aligned."""
    return _padded(k_dim) + _padded(v_dim) + 16


@jit
def _operand(x, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """x as a product operand: rounded to bf16 where PRECISION is 2 (kept as bf16, half the registers; widened
    back to fp32 in the interpreter, which multiplies bf16 bit patterns: triton_support's doc), else x."""
    if PRECISION == 2 and INTERPRET:
        y = x.to(tl.bfloat16).to(tl.float32)
    elif PRECISION == 2:
        y = x.to(tl.bfloat16)
    else:
        y = x
    return y


@jit
def _mm(a, b, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """a @ b of `_operand`s, accumulated in fp32: tensor cores with bf16 (2) or tf32 (1) operands, or ieee
    fp32 (0, the FMA units); the interpreter's products are its fixed-order fp32 sums in every case."""
    if INTERPRET:
        y = tl.dot(a, b, input_precision="ieee")
    elif PRECISION == 2:
        y = tl.dot(a, b)
    elif PRECISION == 1:
        y = tl.dot(a, b, input_precision="tf32")
    else:
        y = tl.dot(a, b, input_precision="ieee")
    return y


@jit
def _gates(a, b, neg_a, bias):
    """g = -exp(A_log) softplus(a + dt_bias) (softplus x itself above its threshold) and β = sigmoid(b), in fp32."""
    x = a.to(tl.float32) + bias
    g = neg_a * tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(tl.where(x > SOFTPLUS_THRESHOLD, 0.0, x))))
    return g, 1.0 / (1.0 + tl.exp(-b.to(tl.float32)))


@jit
def _inverse(system, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """(I + A)^-1 of a strictly lower [C, C] A, by products alone (no serial row loop): with D its SUB-row
    diagonal blocks and L the rest, T_D = (I + D)^-1 = (I - D)(I + D²)(I + D⁴)… (D^SUB = 0), N = T_D L and
    (I + A)^-1 = (I + N)^-1 T_D = (I - N)(I + N²)… T_D (N^(C / SUB) = 0). Every factor is lower
    triangular, so row i of the result reads rows <= i of A alone; the powers stay within a block or a
    few, where entries of |A| <= 1 cannot grow far. Products in tf32 where the others take bf16 (the
    inverse then feeds bf16 products, as flash-linear-attention's does)."""
    INV: tl.constexpr = 1 if PRECISION == 2 else PRECISION
    rows = tl.arange(0, C)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    same_block = rows[:, None] // SUB == rows[None, :] // SUB
    d = tl.where(same_block, system, 0.0)
    inv = eye - d
    power = d
    for _ in tl.static_range(SUB.bit_length() - 2):  # D², D⁴, D⁸ for blocks of 16
        power = _mm(power, power, INV, INTERPRET)
        inv = inv + _mm(inv, power, INV, INTERPRET)
    n = _mm(inv, tl.where(same_block, 0.0, system), INV, INTERPRET)
    t = eye - n
    power = n
    for _ in tl.static_range((C // SUB).bit_length() - 2):  # N² for four blocks
        power = _mm(power, power, INV, INTERPRET)
        t = t + _mm(t, power, INV, INTERPRET)
    return _mm(t, inv, INV, INTERPRET)


@jit
def _rows_mask(rows_in, m_cols, WHOLE: tl.constexpr):
    """[C, D] mask of the rows in `rows_in`, and of the columns `m_cols` unless the tile's columns are all
    in the head (WHOLE): a column mask Triton cannot see through keeps a load from being vectorised."""
    if WHOLE:
        m = rows_in[:, None]
    else:
        m = rows_in[:, None] & m_cols[None, :]
    return m


@jit
def _piece_keys(k, a, b, p_cached, tok64, piece, cached, o_k, m_k, i_kh, i_h, neg_a, bias, stride_kt, stride_kh, stride_at,
                DK: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr,
                INTERPRET: tl.constexpr):
    """Steps 1 and 2 of a chunk piece and W: the rows' keys and gates (the `cached` rows from the slot, the
    `piece` rows from the call, zeros past them), the l2-normalised keys kn, the decay cumsum c, the inverse T
    and W = T (β e^c k). Returns kf, g and β as the slot keeps them, then kn, c, T and W (operands)."""
    rows = tl.arange(0, C)
    below = rows[:, None] > rows[None, :]
    # Every stride is a multiple of 16 elements (gdn_fwd pads where not), so loads are 16-byte vectors.
    k_rows = tl.multiple_of(tok64 * stride_kt + i_kh * stride_kh, 16)
    m_ck, m_pk = _rows_mask(cached, m_k, DK == DK_PAD), _rows_mask(piece, m_k, DK == DK_PAD)
    kf = tl.where(m_ck, tl.load(p_cached[:, None] + o_k[None, :], mask=m_ck, other=0.0),
                  tl.load(k + k_rows[:, None] + o_k[None, :], mask=m_pk, other=0.0).to(tl.float32))
    g, beta = _gates(tl.load(a + tok64 * stride_at + i_h, mask=piece, other=0.0),
                     tl.load(b + tok64 * stride_at + i_h, mask=piece, other=0.0), neg_a, bias)
    g = tl.where(cached, tl.load(p_cached + DK_PAD + DV_PAD, mask=cached, other=0.0), tl.where(piece, g, 0.0))
    beta = tl.where(cached, tl.load(p_cached + DK_PAD + DV_PAD + 1, mask=cached, other=0.0), tl.where(piece, beta, 0.0))
    kn = _operand(kf * (1.0 / tl.sqrt(tl.sum(kf * kf, 1) + L2_EPS))[:, None], PRECISION, INTERPRET)  # [C, DK_PAD]
    c = tl.cumsum(g, 0)
    gram = _mm(kn, tl.trans(kn), PRECISION, INTERPRET)  # [C, C]
    system = tl.where(below, beta[:, None] * gram * tl.exp(tl.where(below, c[:, None] - c[None, :], 0.0)), 0.0)
    inverse = _operand(_inverse(system, C, SUB, PRECISION, INTERPRET), PRECISION, INTERPRET)
    w = _operand(_mm(inverse, _operand((beta * tl.exp(c))[:, None] * kn.to(tl.float32), PRECISION, INTERPRET), PRECISION, INTERPRET),
                 PRECISION, INTERPRET)  # [C, DK_PAD]
    return kf, g, beta, kn, c, inverse, w


@jit
def _piece_values(v, p_cached, tok64, piece, cached, o_v, m_v, i_h, stride_vt, stride_vh, DK_PAD: tl.constexpr, DV: tl.constexpr,
                  BV: tl.constexpr):
    """The rows' values in columns o_v: the `cached` rows from the slot, the `piece` rows from the call, zeros past them."""
    v_rows = tl.multiple_of(tok64 * stride_vt + i_h * stride_vh, 16)
    m_cv, m_pv = _rows_mask(cached, m_v, DV % BV == 0), _rows_mask(piece, m_v, DV % BV == 0)
    return tl.where(m_cv, tl.load(p_cached[:, None] + DK_PAD + o_v[None, :], mask=m_cv, other=0.0),
                    tl.load(v + v_rows[:, None] + o_v[None, :], mask=m_pv, other=0.0).to(tl.float32))


@jit
def _values(inverse, beta, vf, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """U = T (β v), fp32."""
    return _mm(inverse, _operand(beta[:, None] * vf, PRECISION, INTERPRET), PRECISION, INTERPRET)


@jit
def _delta(u, w, s_op, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """δ = U - W S₀, as an operand."""
    return _operand(u - _mm(w, s_op, PRECISION, INTERPRET), PRECISION, INTERPRET)


@jit
def _piece_queries(q, tok64, piece, o_k, m_k, i_kh, kn, c, q_scale, stride_qt, stride_qh, DK: tl.constexpr, DK_PAD: tl.constexpr,
                   C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The l2-normalised, scaled queries and the scores (q kᵀ ∘ decay, j <= i), both as operands."""
    rows = tl.arange(0, C)
    upto = rows[:, None] >= rows[None, :]
    q_rows = tl.multiple_of(tok64 * stride_qt + i_kh * stride_qh, 16)
    qf = tl.load(q + q_rows[:, None] + o_k[None, :], mask=_rows_mask(piece, m_k, DK == DK_PAD), other=0.0).to(tl.float32)
    qn = _operand(qf * (1.0 / tl.sqrt(tl.sum(qf * qf, 1) + L2_EPS))[:, None] * q_scale, PRECISION, INTERPRET)
    scores = tl.where(upto, _mm(qn, tl.trans(kn), PRECISION, INTERPRET) * tl.exp(tl.where(upto, c[:, None] - c[None, :], 0.0)), 0.0)
    return qn, _operand(scores, PRECISION, INTERPRET)


@jit
def _outputs(qn, scores, c, s_op, delta, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """o = e^c (q S₀) + scores δ, with one zero whichever rows shared the products (their exact zeros carry signs)."""
    o = tl.exp(c)[:, None] * _mm(qn, s_op, PRECISION, INTERPRET) + _mm(scores, delta, PRECISION, INTERPRET)
    return tl.where(o == 0.0, 0.0, o)


@jit
def _decayed(kn, c, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """c at the chunk's last row, and the keys decayed to it, e^{c_last - c} k (an operand)."""
    c_last = tl.sum(tl.where(tl.arange(0, C) == C - 1, c, 0.0), 0)
    return c_last, _operand(kn.to(tl.float32) * tl.exp(c_last - c)[:, None], PRECISION, INTERPRET)


@jit
def _advanced(s0, c_last, decayed, delta, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The next chunk's start state e^{c_last} S₀ + decayedᵀ δ."""
    return tl.exp(c_last) * s0 + _mm(tl.trans(decayed), delta, PRECISION, INTERPRET)


# T, has_cache and the strides are not specialised: one compiled kernel serves every case (the module doc).
@jit(do_not_specialize=["T", "has_cache", "every_token", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
                        "stride_at", "stride_ot", "stride_oh"])
def gdn_fwd_kernel(
    q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, candidates,
    T, q_scale, has_cache, every_token,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
):
    # Program (p, h): if a run starts at token p (every_token: while a CUDA graph is captured) or candidates[p]
    # (a new slot, or a position that does not follow the previous token's), walk that run for value head h,
    # one block of value columns after the other.
    NV: tl.constexpr = (DV + BV - 1) // BV
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_t = tl.load(candidates + i_c, mask=every_token == 0, other=0)
    i_t = tl.where(every_token != 0, i_c, i_t)
    pos0 = tl.load(positions + i_t)
    prev_pos = tl.load(positions + i_t - 1, mask=i_t > 0, other=-2)
    starts = (i_t == 0) | (prev_pos + 1 != pos0)
    caching = has_cache != 0
    slot = tl.load(state_ids + i_t, mask=caching, other=0).to(tl.int64)
    starts = starts | (caching & (tl.load(state_ids + i_t - 1, mask=caching & (i_t > 0), other=-1) != slot))
    if starts:
        for i_v in range(NV):
            _run(q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, T, q_scale, i_t, i_h, i_v, i_v == NV - 1,
                 pos0, slot, caching, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
                 GROUP, HV, DK, DV, DK_PAD, DV_PAD, BV, C, SUB, PRECISION, INTERPRET)


@jit
def _run(
    q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, T, q_scale, i_t, i_h, i_v, last_block, pos0, slot,
    caching, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Value head i_h, columns [i_v BV, (i_v + 1) BV) of the run that starts at token i_t, piece by piece."""
    width: tl.constexpr = DK_PAD + DV_PAD + 16
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    m_state = m_k[:, None] & m_v[None, :]
    i_kh = i_h // GROUP
    neg_a = -tl.exp(tl.load(a_log + i_h).to(tl.float32))
    bias = tl.load(dt_bias + i_h).to(tl.float32)
    # The run's start state: the slot's open chunk's, or zeros at position 0 (this program's value columns).
    s0 = tl.load(state + slot * (HV * DK * DV) + i_h * (DK * DV) + o_k[:, None] * DV + o_v[None, :],
                 mask=m_state & (pos0 > 0) & caching, other=0.0)  # [DK_PAD, BV]

    t = i_t.to(tl.int64)  # the token at offset `off` of the current piece
    pos = pos0
    going = pos0 >= 0
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
        cached = rows < off  # the chunk's earlier rows, from the slot (off > 0 only with a cache)
        tok64 = tok.to(tl.int64)
        # The slot as the piece's first token names it (the run's slot): read per piece, so the compiler
        # does not hoist the cache's [C, D] address tiles out of the loop and keep them live.
        p_slot = rows_cache + tl.load(state_ids + t, mask=caching, other=0).to(tl.int64) * (C * HV * width) + i_h * width
        p_cached = p_slot + rows * (HV * width)  # [C]

        kf, g, beta, kn, c, inverse, w = _piece_keys(k, a, b, p_cached, tok64, piece, cached, o_k, m_k, i_kh, i_h, neg_a, bias,
                                                     stride_kt, stride_kh, stride_at, DK, DK_PAD, DV_PAD, C, SUB, PRECISION, INTERPRET)
        vf = _piece_values(v, p_cached, tok64, piece, cached, o_v, m_v, i_h, stride_vt, stride_vh, DK_PAD, DV, BV)
        s_op = _operand(s0, PRECISION, INTERPRET)
        delta = _delta(_values(inverse, beta, vf, PRECISION, INTERPRET), w, s_op, PRECISION, INTERPRET)  # [C, BV]
        qn, scores = _piece_queries(q, tok64, piece, o_k, m_k, i_kh, kn, c, q_scale, stride_qt, stride_qh, DK, DK_PAD, C, PRECISION,
                                    INTERPRET)
        o = _outputs(qn, scores, c, s_op, delta, PRECISION, INTERPRET)
        m_pv = _rows_mask(piece, m_v, DV % BV == 0)
        o_rows = tl.multiple_of(tok64 * stride_ot + i_h * stride_oh, 16)
        tl.store(out + o_rows[:, None] + o_v[None, :], o.to(out.dtype.element_ty), mask=m_pv)
        # A piece that leaves its chunk open: its rows' inputs into the slot for the next call (this block's v
        # columns; k, g and β from the last block, once every block has read the slot's earlier rows).
        keep = piece & caching & (stop < C)
        tl.store(p_cached[:, None] + DK_PAD + o_v[None, :], vf, mask=_rows_mask(keep, m_v, DV % BV == 0))
        keep = keep & last_block
        tl.store(p_cached[:, None] + o_k[None, :], kf, mask=_rows_mask(keep, m_k, DK == DK_PAD))
        tl.store(p_cached + DK_PAD + DV_PAD, g, mask=keep)
        tl.store(p_cached + DK_PAD + DV_PAD + 1, beta, mask=keep)
        if stop == C:
            c_last, decayed = _decayed(kn, c, C, PRECISION, INTERPRET)
            s0 = _advanced(s0, c_last, decayed, delta, PRECISION, INTERPRET)
            closed = pos0 >= 0
        t += stop - off
        pos += stop - off
        going = (stop == C) & (t < T)
        if going:
            going = tl.load(positions + t, mask=t < T, other=-1) == pos
            going = going & (~caching | (tl.load(state_ids + t, mask=caching & (t < T), other=-1) == slot))
    if caching & (closed | (pos0 == 0)):  # the state changed (a chunk closed), or the slot never held this sequence's
        p_state = state + tl.load(state_ids + i_t).to(tl.int64) * (HV * DK * DV) + i_h * (DK * DV)  # reread: see p_slot
        tl.store(p_state + o_k[:, None] * DV + o_v[None, :], s0, mask=m_state)


@jit
def _stored(x, INTERPRET: tl.constexpr):
    """A tile loaded from a buffer of products' operands (bf16 with bf16 products): as loaded, or as fp32 in the
    interpreter, which holds bf16 as raw bits (triton_support's doc)."""
    if INTERPRET:
        x = x.to(tl.float32)
    return x


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


# A call in two launches (`TWO_LAUNCH_MIN_RUN`), the rows' bits those of `gdn_fwd_kernel` (the same helpers, the same
# tiles): every chunk piece's chunk-local work at once, then a walk per run that carries the state alone.
@jit(do_not_specialize=["has_cache", "q_scale", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_at"])
def gdn_chunks_kernel(
    q, k, v, a, b, a_log, dt_bias, rows_cache, state_ids, run_first, chunk_run, chunk_tok0, chunk_off, chunk_stop,
    w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, g_buf, beta_buf,
    has_cache, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Chunk piece i_n (offsets [off, stop) from the call, [0, off) from its run's cache slot), value head i_h:
    W, U, the queries, the scores, the decayed keys, c, g and β of every row below `stop`, by chunk row."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    width: tl.constexpr = DK_PAD + DV_PAD + 16
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
        kf, g, beta, kn, c, inverse, w = _piece_keys(k, a, b, p_cached, tok64, piece, cached, o_k, m_k, i_kh, i_h, neg_a, bias,
                                                     stride_kt, stride_kh, stride_at, DK, DK_PAD, DV_PAD, C, SUB, PRECISION, INTERPRET)
        below = rows < stop
        p = (i_n.to(tl.int64) * C + rows) * HV + i_h  # by chunk row
        m_kout = _rows_mask(below, m_k, DK == DK_PAD)
        tl.store(w_buf + p[:, None] * DK + o_k[None, :], w.to(w_buf.dtype.element_ty), mask=m_kout)
        for i_v in range(NV):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < DV
            vf = _piece_values(v, p_cached, tok64, piece, cached, o_v, m_v, i_h, stride_vt, stride_vh, DK_PAD, DV, BV)
            tl.store(u_buf + p[:, None] * DV + o_v[None, :], _values(inverse, beta, vf, PRECISION, INTERPRET),
                     mask=_rows_mask(below, m_v, DV % BV == 0))
        qn, scores = _piece_queries(q, tok64, piece, o_k, m_k, i_kh, kn, c, q_scale, stride_qt, stride_qh, DK, DK_PAD, C, PRECISION,
                                    INTERPRET)
        tl.store(qn_buf + p[:, None] * DK + o_k[None, :], qn.to(qn_buf.dtype.element_ty), mask=m_kout)
        tl.store(scores_buf + (i_n.to(tl.int64) * HV + i_h) * (C * C) + rows[:, None] * C + rows[None, :], scores.to(scores_buf.dtype.element_ty))
        c_last, decayed = _decayed(kn, c, C, PRECISION, INTERPRET)
        tl.store(decayed_buf + p[:, None] * DK + o_k[None, :], decayed.to(decayed_buf.dtype.element_ty), mask=m_kout)
        tl.store(c_buf + p, c)
        tl.store(g_buf + p, g, mask=piece)
        tl.store(beta_buf + p, beta, mask=piece)


@jit(do_not_specialize=["has_cache", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_ot", "stride_oh"])
def gdn_walk_kernel(
    k, v, out, state, rows_cache, state_ids, positions, run_first, run_len, run_chunk0,
    w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, g_buf, beta_buf,
    has_cache, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Run i_r, value head i_h, value columns [i_v BV, (i_v + 1) BV): from the slot's state (or zeros), δ = U - W S₀
    and the rows' outputs piece by piece from `gdn_chunks_kernel`'s buffers, S₀ from one chunk to the next; then
    the slot as `gdn_fwd_kernel` leaves it (the state, and an open chunk's inputs). PREFETCH: a piece's tiles are
    loaded while the piece before it computes (their latency off the state's chain, for more registers)."""
    NV: tl.constexpr = (DV + BV - 1) // BV
    width: tl.constexpr = DK_PAD + DV_PAD + 16
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
            vf = tl.load(v + v_rows[:, None] + o_v[None, :], mask=m_pv, other=0.0).to(tl.float32)
            tl.store(p_cached[:, None] + DK_PAD + o_v[None, :], vf, mask=m_pv)
            keep = piece & (i_v == NV - 1)
            m_pk = _rows_mask(keep, m_k, DK == DK_PAD)
            k_rows = tl.multiple_of(tok64 * stride_kt + (i_h // GROUP) * stride_kh, 16)
            kf = tl.load(k + k_rows[:, None] + o_k[None, :], mask=m_pk, other=0.0).to(tl.float32)
            tl.store(p_cached[:, None] + o_k[None, :], kf, mask=m_pk)
            tl.store(p_cached + DK_PAD + DV_PAD, tl.load(g_buf + p, mask=keep, other=0.0), mask=keep)
            tl.store(p_cached + DK_PAD + DV_PAD + 1, tl.load(beta_buf + p, mask=keep, other=0.0), mask=keep)
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


def _strided16(t: Tensor, dim_pad: int) -> Tensor:
    """t [T, H, D], or a copy whose rows and heads start on multiples of 16 elements (each head padded to
    `dim_pad`) where t's do not, or its address is not 16-byte aligned: the kernel tells the compiler its
    strides are such multiples (16-byte vector loads) and must see one pointer specialisation in every call."""
    if t.stride(-1) == 1 and t.stride(0) % 16 == 0 and t.stride(1) % 16 == 0 and t.data_ptr() % 16 == 0:
        return t
    padded = t.new_zeros((t.shape[0], t.shape[1], dim_pad))
    padded[..., : t.shape[2]] = t
    return padded[..., : t.shape[2]]


_UNREAD: dict = {}


def _unread(device: torch.device, dtype: torch.dtype) -> Tensor:
    """A small tensor for a pointer argument the kernel never reads (no cache), made once per device and dtype."""
    key = (device, dtype)
    if key not in _UNREAD:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():  # not from a graph's private pool
            return torch.zeros(4, dtype=dtype, device=device)
        _UNREAD[key] = torch.zeros(4, dtype=dtype, device=device)
    return _UNREAD[key]


def gdn_fwd(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size: int, out_dtype: torch.dtype,
            precision: str, block_v: int, num_warps: int, runs: Runs | None = None) -> Tensor:
    """`runs`: `find_runs(positions, state_ids)` where the caller has it already."""
    num_tokens, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    k_pad, v_pad = _padded(k_dim), _padded(v_dim)
    out = _strided16(v.new_empty((num_tokens, num_v_heads, v_dim), dtype=out_dtype), v_pad)
    if num_tokens == 0:
        return out
    q, k, v = _strided16(q, k_pad), _strided16(k, k_pad), _strided16(v, v_pad)
    if a.stride() != b.stride() or a.stride(-1) != 1 or b.stride(-1) != 1:  # the kernel reads both with a's strides
        a, b = a.contiguous(), b.contiguous()
    a_log, dt_bias = a_log.contiguous(), dt_bias.contiguous()
    positions = positions.contiguous()
    runs = runs if runs is not None else find_runs(positions, state_ids)
    has_cache = state is not None
    if has_cache and (state.data_ptr() % 16 or rows.data_ptr() % 16 or not state.is_contiguous() or not rows.is_contiguous()):
        raise ValueError("gdn.core.triton: the cache's state and rows must be contiguous and 16-byte aligned")
    block_v = min(block_v, v_pad)
    ids = state_ids.contiguous() if has_cache else _unread(positions.device, positions.dtype)
    if not has_cache:  # pointers the kernel never reads; a decode step (a CUDA graph) launches nothing else
        state = rows = _unread(v.device, torch.float32)
    every_token = runs is None
    if not every_token and _in_two_launches(num_tokens, runs.first.shape[0], num_v_heads, v.device):
        _fwd_in_two_launches(q, k, v, a, b, a_log, dt_bias, out, state, rows, ids, positions, runs, has_cache, chunk_size, precision,
                             block_v, num_warps)
        return out if out.is_contiguous() else out.contiguous()
    candidates = _unread(positions.device, torch.int32) if every_token else runs.starts
    dims = dict(GROUP=num_v_heads // num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim, DK_PAD=k_pad, DV_PAD=v_pad, C=chunk_size)
    gdn_fwd_kernel[(num_tokens if every_token else candidates.shape[0], num_v_heads)](
        q, k, v, a, b, a_log, dt_bias, out, state, rows, ids, positions, candidates, num_tokens, float(k_dim**-0.5), int(has_cache),
        int(every_token), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), out.stride(0),
        out.stride(1), BV=block_v, SUB=SUB, PRECISION=PRECISIONS[precision], INTERPRET=triton_support.interpreting(),
        num_warps=num_warps, **dims,
    )
    return out if out.is_contiguous() else out.contiguous()


def _env_int(name: str, default: int | None, least: int) -> int | None:
    """A whole number >= least from the environment variable `name`; `default` where it is unset or empty, None
    where it is `off`."""
    value = os.environ.get(name, "")
    if not value:
        return default
    if value == "off":
        return None
    if not value.isdigit() or int(value) < least:
        raise ValueError(f"{name} must be a whole number >= {least} or 'off', got {value!r}")
    return int(value)


def _env_fill(name: str, default: float) -> float | None:
    """Programs an SM from the environment variable `name` (a positive number); `default` where it is unset or
    empty, None where it is `off`."""
    value = os.environ.get(name, "")
    if not value:
        return default
    if value == "off":
        return None
    try:
        fill = float(value)
    except ValueError:
        fill = -1.0
    if not fill > 0:
        raise ValueError(f"{name} must be a positive number or 'off', got {value!r}")
    return fill


# The calls whose runs average at least TWO_LAUNCH_MIN_RUN tokens, and whose one launch would have at most
# TWO_LAUNCH_MAX_FILL programs (runs x value heads) an SM, run in two launches, `gdn_chunks_kernel` (every chunk
# piece's chunk-local work at once) and `gdn_walk_kernel` (a walk per run and block of value columns that carries the
# state alone); the others, and every call captured in a CUDA graph, in one, `gdn_fwd_kernel`. The rows' bits are the
# same either way: the same helpers and tiles, and compiled for sm_90 the reductions take the one kernel's layouts;
# tests/ops/gdn/test_triton.py and benchmarks/gdn_bits.py compare them. The thresholds are from an H200 at Qwen3.5's
# heads (docs/gdn.md, "Two launches"): two launches took 2 x 4096 tokens from 2.8 ms to 1.9 (64 and 32 programs on
# 132 SMs), were even at one run of 2048, and slower with 8 x 2048 (128 and 256 programs: 2.0 against 1.8) or one
# run of 512 (0.9 against 0.7). ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN=n (or `off`: one launch always) sets the run length
# for a process, ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL=x (or `off`) the fill; off a GPU (the interpreter) the run
# length alone decides.
TWO_LAUNCH_MIN_RUN: int | None = _env_int("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", 2048, least=1)
TWO_LAUNCH_MAX_FILL: float | None = _env_fill("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", 0.5)
# The walk's block of value columns, None for the contract's `block_v` (ISOEXEC_GDN_WALK_BLOCK_V=n, a power of
# two >= 16, or `off`, sets it for a process): an output element's products run over the head dim whatever the block's
# width, so its bits do not depend on it (equal on the CPU and, at heads of 128, on an H200), and a narrower block
# keeps the walk's state tile in fewer registers (ptxas for sm_90, heads of 128: 255 registers and 248 bytes of
# spills at 128 columns, 204 and none at 64, 174 at 32). 64 columns prefetched were the fastest at 32 value heads.
WALK_BLOCK_V: int | None = _env_int("ISOEXEC_GDN_WALK_BLOCK_V", 64, least=16)
if WALK_BLOCK_V is not None and WALK_BLOCK_V & (WALK_BLOCK_V - 1):
    raise ValueError(f"ISOEXEC_GDN_WALK_BLOCK_V must be a power of two >= 16, got {WALK_BLOCK_V}")
# Whether the walk loads a piece's tiles while the piece before it computes (ISOEXEC_GDN_WALK_PREFETCH=0 turns it
# off): the loads' latency leaves the state's chain, for the registers of a second set of tiles (241 at 64 columns
# with the decayed keys among them, no spills; at 128 the spills grow); 0.91 ms against 1.47 for one run of 512
# tokens on an H200 (before the decayed keys joined the prefetch).
WALK_PREFETCH: bool = bool(_env_int("ISOEXEC_GDN_WALK_PREFETCH", 1, least=0))


def _in_two_launches(num_tokens: int, runs: int, num_v_heads: int, device: torch.device) -> bool:
    if TWO_LAUNCH_MIN_RUN is None or num_tokens < TWO_LAUNCH_MIN_RUN * runs:
        return False
    if TWO_LAUNCH_MAX_FILL is None or device.type != "cuda":
        return True
    return runs * num_v_heads <= TWO_LAUNCH_MAX_FILL * torch.cuda.get_device_properties(device).multi_processor_count


def _fwd_in_two_launches(q, k, v, a, b, a_log, dt_bias, out, state, rows, state_ids, positions, runs, has_cache, chunk_size, precision,
                         block_v, num_warps) -> None:
    """`out` (and the cache) of a call in two launches; the tensors as gdn_fwd pads them."""
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
    dims = dict(GROUP=num_v_heads // num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim, DK_PAD=k_pad, DV_PAD=v_pad, BV=block_v, C=chunk_size,
                PRECISION=PRECISIONS[precision], INTERPRET=triton_support.interpreting(), num_warps=num_warps)
    buffers = (w_buf, u_buf, qn_buf, scores_buf, decayed_buf, c_buf, g_buf, beta_buf)
    gdn_chunks_kernel[(num_chunks, num_v_heads)](
        q, k, v, a, b, a_log, dt_bias, rows, state_ids, first, chunk_run, tok0, chunk_off, chunk_stop, *buffers, int(has_cache),
        float(k_dim**-0.5), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), SUB=SUB, **dims,
    )
    walk_block = min(WALK_BLOCK_V or block_v, v_pad)
    gdn_walk_kernel[(first.shape[0], num_v_heads, triton_support.cdiv(v_dim, walk_block))](
        k, v, out, state, rows, state_ids, positions, first, length, chunk0, *buffers, int(has_cache), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), out.stride(0), out.stride(1), PREFETCH=WALK_PREFETCH, **{**dims, "BV": walk_block},
    )


class _TritonGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a, b, a_log, dt_bias, positions, chunk_size, dtypes, tiles, runs):
        ctx.save_for_backward(q, k, v, a, b, a_log, dt_bias, positions)
        ctx.tiles = tiles
        ctx.runs = runs  # for the backward too (None while a graph is captured)
        return gdn_fwd(q, k, v, a, b, a_log, dt_bias, None, None, None, positions, chunk_size, torch_dtype(dtypes["output_dtype"]),
                       runs=ctx.runs, **tiles)

    @staticmethod
    def backward(ctx, grad):
        from .triton_bwd import gdn_bwd  # it builds on this module's helpers

        saved = ctx.saved_tensors
        grads = gdn_bwd(*saved, grad, ctx.tiles["precision"], ctx.runs)
        return (*(g.to(t.dtype) if need else None for g, t, need in zip(grads, saved, ctx.needs_input_grad)), None, None, None, None, None)


def check_constants(constants: dict) -> None:
    """Refuse dtypes, chunk sizes and precisions the kernel does not implement (one-line ValueErrors)."""
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    for name in ("input_dtype", "output_dtype"):
        if constants[name] not in DTYPES:
            raise ValueError(f"{ID}: {name} must be one of {', '.join(DTYPES)}, got {constants[name]!r}")
    chunk = constants["chunk_size"]
    if chunk not in (16, 32, 64):
        raise ValueError(f"{ID}: chunk_size must be 16, 32 or 64 (whole {SUB}-row blocks of the inverse, tl.dot's smallest tile), "
                         f"got {chunk!r}")
    block_v = constants["block_v"]
    if not isinstance(block_v, int) or block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"{ID}: block_v must be a power of two >= 16, got {block_v!r}")
    if chunk == 64 and block_v < 64:
        # Compiled for sm_90 by Triton 3.6 at heads of 128, this pair faults in a shared-memory read Triton
        # plans for the q norm's reduction (compute-sanitizer; docs/experiments.md, 2026-12-02).
        raise ValueError(f"{ID}: chunk_size 64 needs block_v >= 64 (smaller value blocks crash the compiled kernel), got {block_v}")
    if constants["dot_precision"] not in PRECISIONS:
        raise ValueError(f"{ID}: dot_precision must be one of {', '.join(PRECISIONS)}, got {constants['dot_precision']!r}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16):
        raise ValueError(f"{ID}: num_warps must be a power of two <= 16, got {constants['num_warps']!r}")


def gdn_core(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, state: Tensor | None = None,
             rows: Tensor | None = None, state_ids: Tensor | None = None, positions: Tensor | None = None, *, input_dtype: str,
             output_dtype: str, accum_dtype: str, chunk_size: int, dot_precision: str, block_v: int, num_warps: int) -> Tensor:
    """Same arguments and result as `reference.gdn_core` (its docstring), with this impl's cache rows
    [N, C, Hv, `row_width`]: the open chunk's inputs."""
    check_constants(dict(input_dtype=input_dtype, output_dtype=output_dtype, accum_dtype=accum_dtype, chunk_size=chunk_size,
                         dot_precision=dot_precision, block_v=block_v, num_warps=num_warps))
    if positions is None:
        raise ValueError("gdn.core: positions are required")
    check_inputs(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size, input_dtype,
                 row_width(v.shape[1], q.shape[-1], v.shape[-1]))
    runs = find_runs(positions, state_ids)  # one host read a forward (runs.py), the checks' values with it
    check_runs(runs, state)
    require_device(ID, q, k, v, a, b)
    tiles = dict(precision=dot_precision, block_v=block_v, num_warps=num_warps)
    if needs_grad(q, k, v, a, b, a_log, dt_bias):
        dtypes = dict(input_dtype=input_dtype, output_dtype=output_dtype)
        return _TritonGDN.apply(q, k, v, a, b, a_log, dt_bias, positions, chunk_size, dtypes, tiles, runs)
    return gdn_fwd(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size, torch_dtype(output_dtype), runs=runs,
                   **tiles)


SOURCES = (gdn_fwd_kernel, _run, gdn_chunks_kernel, gdn_walk_kernel, _walk_tiles, _piece_keys, _piece_values, _values, _delta, _piece_queries, _outputs,
           _decayed, _advanced, _stored, _gates, _inverse, _mm, _operand, _rows_mask, triton_support)


def register(registry) -> None:
    """Register gdn.core.triton@3; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=VERSION, region="gdn.core", cases=ALL_CASES, fn=gdn_core,
                               check_constants=check_constants, sources=SOURCES, row_width=row_width))
