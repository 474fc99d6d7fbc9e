"""One online-softmax step over a key block, for attention.triton's walk (`triton.py`) and its decode rows with the
key blocks spread over the grid (`triton_blocks.py`): the one copy of this arithmetic, which decides every row's bits
(triton.py's module doc)."""
from __future__ import annotations

from ..triton_support import jit, settled, tl


@jit
def _row_sum(p, SUM_BY_DOT: tl.constexpr):
    """sum_j p[:, j] in an order that does not depend on which rows share the tile. In bf16 the scores
    come in the tensor cores' accumulator layout, fixed by the tile's shape and warps, which the
    contract pins for every case (other shapes can change bits: 16 vs 64 rows at head_dim 128, or 2
    warps with 4 heads per KV head, on an H200). fp32 dots run on the CUDA cores in a blocked layout
    that tl.sum's tree follows and that the tile constants choose, so there the sum is a dot with ones:
    one fused multiply-add per key, in key order, whatever the layout."""
    if SUM_BY_DOT:
        ones = tl.full([p.shape[1], 16], 1.0, dtype=tl.float32)
        return tl.max(tl.dot(p, ones, input_precision="ieee"), 1)  # 16 equal columns
    return tl.sum(p, 1)


@jit
def _gather_kv(slots, keep, kv_head, k, v, stride_ks, stride_kh, stride_vs, stride_vh, D: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """K^T [D, BLOCK_N] and V [BLOCK_N, D] of one key block, gathered through its store slots; keys not
    in `keep` read +0.0 (their slots may be -1, or hold NaN/inf)."""
    o_d = tl.arange(0, D)
    b_k = tl.load(k + slots[None, :] * stride_ks + kv_head * stride_kh + o_d[:, None], mask=keep[None, :], other=0.0)
    b_v = tl.load(v + slots[:, None] * stride_vs + kv_head * stride_vh + o_d[None, :], mask=keep[:, None], other=0.0)
    if DOT_IN_FP32:  # the interpreter has no bfloat16 arithmetic
        b_k, b_v = b_k.to(tl.float32), b_v.to(tl.float32)
    return b_k, b_v


@jit
def _scores(b_q, b_k, vis, scale):
    """One key block's scores for every row [ROWS, BLOCK_N] fp32, -inf where `vis` hides a key."""
    s = tl.dot(b_q, b_k, input_precision="ieee") * scale
    return tl.where(vis, s, float("-inf"))


@jit
def _running_max(m, s):
    """The running max after a block of scores, the max a row subtracts (0 for a row with no finite score
    yet), and the factor the state before it is rescaled by."""
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, m_safe, tl.exp(m - m_safe)


@jit
def _probs_times_v(s, m_safe, b_v, DOT_IN_FP32: tl.constexpr):
    """p = exp(s - m) (0 where s is -inf: hidden), and p · V [ROWS, D] fp32. The product is `settled`: left
    as a separate sum, Triton would fold the add that follows into the dot's accumulator (other bits)."""
    p = tl.exp(s - m_safe[:, None])
    pv = tl.dot(p.to(b_v.dtype), b_v, input_precision="ieee")  # ieee: fp32 is never tf32
    return p, settled(pv, DOT_IN_FP32)


@jit
def _visible(i_blk, pos, row_ok, seq_row, L, S, window, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key block i_blk's store slots [BLOCK_N] (-1 past the table), which keys each row sees [ROWS, BLOCK_N]
    (at or before its position, inside the table and the window, written), which keys some row sees (written,
    finite) and which rows see a key of it."""
    keys = i_blk * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] absolute key positions
    vis = (keys[None, :] <= pos[:, None]) & (keys[None, :] < L) & row_ok[:, None]  # [ROWS, BLOCK_N]
    if HAS_WINDOW:
        vis = vis & (keys[None, :] > pos[:, None] - window)
    slots = tl.load(seq_row + keys, mask=keys < L, other=-1).to(tl.int64)  # [BLOCK_N]
    vis = vis & ((slots >= 0) & (slots < S))[None, :]
    return slots, vis, tl.max(vis.to(tl.int32), 0) > 0, tl.max(vis.to(tl.int32), 1) > 0


@jit
def _fold_sums(l, acc, alpha, p_sum, pv):
    """The state after a block from its Σ p and p · V: l · alpha + Σ p, acc · alpha + p · V."""
    return l * alpha + p_sum, acc * alpha[:, None] + pv


@jit
def _fold(l, acc, alpha, p, pv, SUM_BY_DOT: tl.constexpr):
    """The state after a block: l · alpha + Σ p, acc · alpha + p · V."""
    return _fold_sums(l, acc, alpha, _row_sum(p, SUM_BY_DOT), pv)


@jit
def _finish(l, acc):
    """Whether each row saw a key, and its output acc / l (0 for a row that saw none; a zero acc taken as +0.0,
    triton.py's module doc)."""
    has_keys = l > 0.0
    acc = tl.where(acc == 0.0, 0.0, acc)
    return has_keys, tl.where(has_keys[:, None], acc / tl.where(has_keys, l, 1.0)[:, None], 0.0)


@jit
def _update(m, l, acc, b_q, b_k, b_v, vis, scale, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr):
    """The online-softmax step over one key block, for every row; `vis` (broadcast to [ROWS, BLOCK_N])
    marks the keys each row sees. Its pieces are the one copy of this arithmetic: every walk calls them
    in this order for each block."""
    s = _scores(b_q, b_k, vis, scale)
    m_new, m_safe, alpha = _running_max(m, s)
    p, pv = _probs_times_v(s, m_safe, b_v, DOT_IN_FP32)
    l_new, acc_new = _fold(l, acc, alpha, p, pv, SUM_BY_DOT)
    return m_new, l_new, acc_new
