"""The tiles of one chunk piece, shared by gdn.core.triton's kernels (`triton.py`, `triton_two_launch.py`) and its
backward (`triton_bwd.py`). Every tile has C rows, row r at chunk offset r whatever the piece computes.

A chunk piece, for rows r < `stop` (rows past it are zero, finite and never read by a row before them):
1. gates, l2 norms (`tl.sum` over the head dim), the decay cumsum c (`tl.cumsum` over the C rows: a prefix
   scan, so row r's value depends on rows <= r alone);
2. A = β_i (k_i · k_j) exp(c_i - c_j) below the diagonal, one product; T = (I + A)^-1 by block products
   (`_inverse`, the contract's `inverse = "products"`): every factor lower triangular, so row i of T reads rows <= i
   of A only; or by rows (`_inverse_rows`, `inverse = "rows"`): row i from row i of A and T's rows before it, which
   a piece continuing an open chunk reads from the slot (a decode step computes its own row alone);
3. W = T (β e^c k), U = T (β v), δ = U - W S₀, o = e^c (q S₀) + (q kᵀ ∘ decay, j <= i) δ; when the chunk
   closes, S₀ ← e^{c_last} S₀ + (k e^{c_last - c})ᵀ δ.
The products take `dot_precision` (ieee fp32 on the FMA units, tf32 or bf16 operands on the tensor cores,
fp32 accumulation either way; the inverse's take tf32 where the others take bf16). An MMA's element is a
function of its own row and column, and the rows a row does not see are zero or multiplied by an exact
zero, so a row's bits do not depend on the rows after it (a zero's sign may: the output takes +0.0).
"""
from __future__ import annotations

from torch import Tensor

from ..triton_support import jit, next_power_of_2, tl
from .reference import L2_EPS as _L2_EPS
from .reference import SOFTPLUS_THRESHOLD as _SOFTPLUS_THRESHOLD

# The reference's constants, as constexprs a kernel may read.
L2_EPS = tl.constexpr(_L2_EPS) if tl is not None else _L2_EPS
SOFTPLUS_THRESHOLD = tl.constexpr(_SOFTPLUS_THRESHOLD) if tl is not None else _SOFTPLUS_THRESHOLD
PRECISIONS = {"ieee": 0, "tf32": 1, "bf16": 2}
INVERSES = {"products": 0, "rows": 1}
SUB = 16  # rows of the inverse's diagonal blocks: tl.dot's smallest tile
# A cached row's fields, per value head: k [DK_PAD], v [DV_PAD], g and β (padded to 16 floats), then, under the rows
# inverse alone, T's row (T_FIELD floats, the largest chunk the kernel takes), so that every field starts 64-byte aligned.
# k and v are kept in the input dtype at the start of their fields (bf16: the first half), so that a row's k or v is
# one load, from the slot or from the call, where two loads of different dtypes were (`_key_loads`, `_piece_values`).
_T_FIELD = 64
T_FIELD = tl.constexpr(_T_FIELD) if tl is not None else _T_FIELD


def row_floats(k_pad: int, v_pad: int, rows: bool) -> int:
    """Floats a cached open-chunk row holds per value head (the fields above; T's row where `rows`)."""
    return k_pad + v_pad + 16 + (_T_FIELD if rows else 0)


def _padded(dim: int) -> int:
    """A head dim as the kernel tiles it: a power of two >= 16 (tl.dot's smallest tile)."""
    return max(16, next_power_of_2(dim))




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
    inverse then feeds bf16 products, as flash-linear-attention's does). A chunk of one block (C = SUB) has no L:
    its inverse is T_D, with no products by N = 0 and I - N = I on the serial chain of a decode step."""
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
    if C > SUB:
        n = _mm(inv, tl.where(same_block, 0.0, system), INV, INTERPRET)
        t = eye - n
        power = n
        for _ in tl.static_range((C // SUB).bit_length() - 2):  # N² for four blocks
            power = _mm(power, power, INV, INTERPRET)
            t = t + _mm(t, power, INV, INTERPRET)
        inv = _mm(t, inv, INV, INTERPRET)
    return inv


@jit
def _inverse_rows(system, t_cached, off, stop, C: tl.constexpr):
    """(I + A)^-1 of a strictly lower [C, C] A by forward substitution, rows off <= r < stop in turn: row r is
    e_r - A_r T, an ieee product of A's row r (alone in its tile) and T's rows so far, so each element is one FMA chain
    over j in ascending order whatever the layout (no tensor core, no reduction tree), and rows past r are zero there.
    Rows below `off` are `t_cached` (the slot's, computed so by an earlier call); rows from `stop` on are zero. So row r's
    bits depend on rows <= r of A and on nothing a call's extent changes: a decode step at offset r computes it in one
    product from the rows the slot keeps."""
    rows = tl.arange(0, C)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    t = t_cached
    r = off
    while r < stop:
        here = rows[:, None] == r
        t = tl.where(here, eye - tl.dot(tl.where(here, system, 0.0), t, input_precision="ieee"), t)
        r += 1
    return t


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
def _piece_keys(k, a, b, p_cached, tok64, piece, loaded, cached, o_k, m_k, i_kh, i_h, neg_a, bias, stride_kt, stride_kh, stride_at,
                DK: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr,
                ROWS: tl.constexpr, INTERPRET: tl.constexpr, TILED: tl.constexpr = False):
    """Steps 1 and 2 of a chunk piece and W (`_key_inputs`, then `_key_chain`). Returns kf, g and β as the slot keeps
    them, T in fp32 as the slot keeps it (ROWS; else the operand again), then kn, c, T and W (operands)."""
    kf, g, beta = _key_inputs(k, a, b, p_cached, tok64, piece, loaded, cached, o_k, m_k, i_kh, i_h, neg_a, bias, stride_kt, stride_kh,
                              stride_at, DK, DK_PAD, DV_PAD, TILED)
    t_rows, kn, c, inverse, w = _key_chain(kf, g, beta, p_cached, piece, cached, DK_PAD, DV_PAD, C, SUB, PRECISION, ROWS, INTERPRET)
    return kf, g, beta, t_rows, kn, c, inverse, w


@jit
def _key_inputs(k, a, b, p_cached, tok64, piece, loaded, cached, o_k, m_k, i_kh, i_h, neg_a, bias, stride_kt, stride_kh, stride_at,
                DK: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, TILED: tl.constexpr = False):
    """Step 1's inputs: the rows' keys and gates, the `cached` rows from the slot, the `piece` rows from the call, zeros
    past them (kf, g and β as the slot keeps them). `loaded` ⊇ `piece`: the call's rows read (`_piece_values`), those
    outside the piece then zeroed. `_key_loads`, then `_gates_of`."""
    kf, a_new, b_new, g_cached, beta_cached = _key_loads(k, a, b, p_cached, tok64, piece, loaded, cached, o_k, m_k, i_kh, i_h,
                                                         stride_kt, stride_kh, stride_at, DK, DK_PAD, DV_PAD, TILED)
    g, beta = _gates_of(a_new, b_new, g_cached, beta_cached, piece, cached, neg_a, bias)
    return kf, g, beta


@jit
def _key_loads(k, a, b, p_cached, tok64, piece, loaded, cached, o_k, m_k, i_kh, i_h, stride_kt, stride_kh, stride_at, DK: tl.constexpr,
               DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, TILED: tl.constexpr = False):
    """`_key_inputs`' loads: kf, then the call's a and b and the slot's g and β for `_gates_of`. Apart because the gates'
    log (libdevice's, with a branch for its special cases) ends a basic block: a load placed after it in the program
    waits for the loads the log reads before it is issued. TILED: a and b through one [C, 16] pointer tile, the slot's
    g and β as one [C, 16] tile of the row's gate field, each value taken out by a sum of it and zeros (exact but for a
    zero's sign, which no later step reads): two loads where four row vectors were, each of which Triton loads again
    for every layout it is used in. Taken by the wider blocks and the unsplit kernel, where a step over a chunk took
    14.6 us at batch 8 against 15.3 and 34.0 against 35.9 at batch 16 on an H100 (the same bits; docs/experiments.md,
    "Gate loads in pairs and tiles"); the 32-column programs keep the row vectors, which timed 0.25 us faster there at
    batch 1."""
    # Every stride is a multiple of 16 elements (gdn_fwd pads where not), so loads are 16-byte vectors.
    k_rows = tl.multiple_of(tok64 * stride_kt + i_kh * stride_kh, 16)
    m_ck, m_pk = _rows_mask(cached, m_k, DK == DK_PAD), _rows_mask(piece, m_k, DK == DK_PAD)
    # One load a row, from the slot (its k field holds the input dtype's values) or from the call.
    k_slot = _in_dtype(p_cached, k)
    p_k = tl.where(cached[:, None], k_slot[:, None] + o_k[None, :], k + k_rows[:, None] + o_k[None, :])
    k_any = tl.load(p_k, mask=_rows_mask(loaded | cached, m_k, DK == DK_PAD), other=0.0).to(tl.float32)
    kf = tl.where(m_ck | m_pk, k_any, 0.0)
    if TILED:
        cols = tl.arange(0, 16)
        p_ab = tl.where(cols[None, :] == 0, a, b) + (tok64 * stride_at + i_h)[:, None]
        ab = tl.load(p_ab, mask=loaded[:, None] & (cols[None, :] < 2), other=0.0).to(tl.float32)
        a_new = tl.sum(tl.where(cols[None, :] == 0, ab, 0.0), 1)
        b_new = tl.sum(tl.where(cols[None, :] == 1, ab, 0.0), 1)
        field = tl.load(p_cached[:, None] + DK_PAD + DV_PAD + cols[None, :], mask=cached[:, None] & (cols[None, :] < 2), other=0.0)
        g_cached = tl.sum(tl.where(cols[None, :] == 0, field, 0.0), 1)
        beta_cached = tl.sum(tl.where(cols[None, :] == 1, field, 0.0), 1)
    else:
        a_new = tl.load(a + tok64 * stride_at + i_h, mask=loaded, other=0.0)
        b_new = tl.load(b + tok64 * stride_at + i_h, mask=loaded, other=0.0)
        g_cached = tl.load(p_cached + DK_PAD + DV_PAD, mask=cached, other=0.0)
        beta_cached = tl.load(p_cached + DK_PAD + DV_PAD + 1, mask=cached, other=0.0)
    return kf, a_new, b_new, g_cached, beta_cached


@jit
def _gates_of(a_new, b_new, g_cached, beta_cached, piece, cached, neg_a, bias):
    """g and β of a piece's rows from `_key_loads`' values: the slot's for `cached` rows, the gates of the call's for
    `piece` rows, zeros past them."""
    g, beta = _gates(a_new, b_new, neg_a, bias)
    g = tl.where(cached, g_cached, tl.where(piece, g, 0.0))
    beta = tl.where(cached, beta_cached, tl.where(piece, beta, 0.0))
    return g, beta


@jit
def _key_chain(kf, g, beta, p_cached, piece, cached, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr,
               PRECISION: tl.constexpr, ROWS: tl.constexpr, INTERPRET: tl.constexpr):
    """Step 2 and W from step 1's inputs: the l2-normalised keys kn, the decay cumsum c, the inverse T (by rows where
    ROWS, T's cached rows from the slot) and W = T (β e^c k). Returns T in fp32 as the slot keeps it (ROWS; else the
    operand again), then kn, c, T and W (operands)."""
    rows = tl.arange(0, C)
    below = rows[:, None] > rows[None, :]
    kn = _operand(kf * (1.0 / tl.sqrt(tl.sum(kf * kf, 1) + L2_EPS))[:, None], PRECISION, INTERPRET)  # [C, DK_PAD]
    c = tl.cumsum(g, 0)
    gram = _mm(kn, tl.trans(kn), PRECISION, INTERPRET)  # [C, C]
    system = tl.where(below, beta[:, None] * gram * tl.exp(tl.where(below, c[:, None] - c[None, :], 0.0)), 0.0)
    if ROWS:
        off = tl.sum(cached.to(tl.int32), 0)
        t_cached = tl.load(p_cached[:, None] + DK_PAD + DV_PAD + 16 + rows[None, :], mask=cached[:, None], other=0.0)
        t_rows = _inverse_rows(system, t_cached, off, off + tl.sum(piece.to(tl.int32), 0), C)
        inverse = _operand(t_rows, PRECISION, INTERPRET)
    else:
        inverse = _operand(_inverse(system, C, SUB, PRECISION, INTERPRET), PRECISION, INTERPRET)
        t_rows = inverse
    w = _operand(_mm(inverse, _operand((beta * tl.exp(c))[:, None] * kn.to(tl.float32), PRECISION, INTERPRET), PRECISION, INTERPRET),
                 PRECISION, INTERPRET)  # [C, DK_PAD]
    return t_rows, kn, c, inverse, w


@jit
def _piece_values(v, p_cached, tok64, piece, loaded, cached, o_v, m_v, i_h, stride_vt, stride_vh, DK_PAD: tl.constexpr,
                  DV: tl.constexpr, BV: tl.constexpr):
    """The rows' values in columns o_v: the `cached` rows from the slot, the `piece` rows from the call, zeros past them.
    `loaded` ⊇ `piece`: the call's rows read, those outside the piece then zeroed, so a caller that learns where its
    piece ends from loads of its own can issue these beside them rather than after (`gdn_fwd_kernel`); the same values
    as a load masked by `piece`, so the same bits."""
    v_rows = tl.multiple_of(tok64 * stride_vt + i_h * stride_vh, 16)
    m_cv, m_pv = _rows_mask(cached, m_v, DV % BV == 0), _rows_mask(piece, m_v, DV % BV == 0)
    v_slot = _in_dtype(p_cached + DK_PAD, v)
    p_v = tl.where(cached[:, None], v_slot[:, None] + o_v[None, :], v + v_rows[:, None] + o_v[None, :])
    v_any = tl.load(p_v, mask=_rows_mask(loaded | cached, m_v, DV % BV == 0), other=0.0).to(tl.float32)
    return tl.where(m_cv | m_pv, v_any, 0.0)


@jit
def _in_dtype(p, x):
    """The fp32 slot pointers p as pointers to x's element type (the slot keeps k and v in the input dtype, so that a
    row's value is one load from the slot or the call)."""
    return p.to(x.dtype, bitcast=True)


@jit
def _values(inverse, beta, vf, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """U = T (β v), fp32."""
    return _mm(inverse, _operand(beta[:, None] * vf, PRECISION, INTERPRET), PRECISION, INTERPRET)


@jit
def _delta(u, w, s_op, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """δ = U - W S₀, as an operand."""
    return _operand(u - _mm(w, s_op, PRECISION, INTERPRET), PRECISION, INTERPRET)


@jit
def _piece_queries(q, tok64, piece, loaded, o_k, m_k, i_kh, kn, c, q_scale, stride_qt, stride_qh, DK: tl.constexpr,
                   DK_PAD: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """`_query_inputs`, then `_queries`."""
    qf = _query_inputs(q, tok64, piece, loaded, o_k, m_k, i_kh, stride_qt, stride_qh, DK, DK_PAD)
    return _queries(qf, kn, c, q_scale, C, PRECISION, INTERPRET)


@jit
def _query_inputs(q, tok64, piece, loaded, o_k, m_k, i_kh, stride_qt, stride_qh, DK: tl.constexpr, DK_PAD: tl.constexpr):
    """The `piece` rows' queries, zeros elsewhere (`loaded` as `_piece_values`)."""
    q_rows = tl.multiple_of(tok64 * stride_qt + i_kh * stride_qh, 16)
    qf = tl.load(q + q_rows[:, None] + o_k[None, :], mask=_rows_mask(loaded, m_k, DK == DK_PAD), other=0.0).to(tl.float32)
    return tl.where(_rows_mask(piece, m_k, DK == DK_PAD), qf, 0.0)


@jit
def _queries(qf, kn, c, q_scale, C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """The l2-normalised, scaled queries and the scores (q kᵀ ∘ decay, j <= i), both as operands."""
    rows = tl.arange(0, C)
    upto = rows[:, None] >= rows[None, :]
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

@jit
def _stored(x, INTERPRET: tl.constexpr):
    """A tile loaded from a buffer of products' operands (bf16 with bf16 products): as loaded, or as fp32 in the
    interpreter, which holds bf16 as raw bits (triton_support's doc)."""
    if INTERPRET:
        x = x.to(tl.float32)
    return x


def _strided16(t: Tensor, dim_pad: int) -> Tensor:
    """t [T, H, D], or a copy whose rows and heads start on multiples of 16 elements (each head padded to
    `dim_pad`) where t's do not, or its address is not 16-byte aligned: the kernel tells the compiler its
    strides are such multiples (16-byte vector loads) and must see one pointer specialisation in every call."""
    if t.stride(-1) == 1 and t.stride(0) % 16 == 0 and t.stride(1) % 16 == 0 and t.data_ptr() % 16 == 0:
        return t
    padded = t.new_zeros((t.shape[0], t.shape[1], dim_pad))
    padded[..., : t.shape[2]] = t
    return padded[..., : t.shape[2]]


