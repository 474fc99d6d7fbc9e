"""One online-softmax step over a key block and the walk over a row's blocks, for attention.triton's tiles
(`triton.py`), its decode rows with the key blocks spread over the grid (`triton_blocks.py`) and its decode rows by
spans (`triton_spans.py`): the one copy of this arithmetic, which decides every row's bits (triton.py's module doc)."""
from __future__ import annotations

from ..triton_support import exp_ftz, jit, rounded_mul, settled, tl


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
    b_k = tl.load(k + slots[None, :] * stride_ks + kv_head * stride_kh + tl.arange(0, D)[:, None], mask=keep[None, :], other=0.0)
    if DOT_IN_FP32:  # the interpreter has no bfloat16 arithmetic
        b_k = b_k.to(tl.float32)
    return b_k, _gather_v(slots, keep, kv_head, v, stride_vs, stride_vh, D, DOT_IN_FP32)


@jit
def _gather_v(slots, keep, kv_head, v, stride_vs, stride_vh, D: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """`_gather_kv`'s V alone."""
    b_v = tl.load(v + slots[:, None] * stride_vs + kv_head * stride_vh + tl.arange(0, D)[None, :], mask=keep[:, None], other=0.0)
    if DOT_IN_FP32:
        b_v = b_v.to(tl.float32)
    return b_v


@jit
def _scores(b_q, b_k, vis, scale, INTERPRETED: tl.constexpr):
    """One key block's scores for every row [ROWS, BLOCK_N] fp32, -inf where `vis` hides a key. The product by
    scale is rounded on its own (`rounded_mul`): where `vis` is the constant true (a checked whole block) nothing
    stands between it and the subtraction of the max, which it would otherwise fuse with."""
    s = rounded_mul(_products(b_q, b_k), scale, INTERPRETED)
    return tl.where(vis, s, float("-inf"))


@jit
def _products(b_q, b_k):
    """q · k [ROWS, BLOCK_N] fp32, unscaled (ieee: fp32 operands are never tf32): what `_scores` scales."""
    return tl.dot(b_q, b_k, input_precision="ieee")


@jit
def _running_max(m, s, INTERPRETED: tl.constexpr):
    """The running max after a block of scores, the max a row subtracts (0 for a row with no finite score
    yet), and the factor the state before it is rescaled by (`exp_ftz`, as every exp of the walk)."""
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, m_safe, exp_ftz(m - m_safe, INTERPRETED)


@jit
def _probs_times_v(s, m_safe, b_v, DOT_IN_FP32: tl.constexpr):
    """p = exp(s - m) (0 where s is -inf: hidden), and p · V [ROWS, D] fp32. The product is `settled`: left
    as a separate sum, Triton would fold the add that follows into the dot's accumulator (other bits)."""
    p = exp_ftz(s - m_safe[:, None], DOT_IN_FP32)
    pv = tl.dot(p.to(b_v.dtype), b_v, input_precision="ieee")  # ieee: fp32 is never tf32
    return p, settled(pv, DOT_IN_FP32)


@jit
def _visible(i_blk, pos, row_ok, seq_row, L, S, window, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key block i_blk's store slots [BLOCK_N] (-1 past the table), which keys each row sees [ROWS, BLOCK_N]
    (at or before its position, inside the table and the window, written), which keys some row sees (written,
    finite) and which rows see a key of it."""
    return _visible_slots(_block_slots(i_blk * BLOCK_N, seq_row, L, BLOCK_N), i_blk, pos, row_ok, L, S, window, HAS_WINDOW, BLOCK_N)


@jit
def _block_slots(first_key, seq_row, L, WIDTH: tl.constexpr):
    """The store slots [WIDTH] of keys [first_key, first_key + WIDTH) of a table row (-1 past the table)."""
    keys = first_key + tl.arange(0, WIDTH)
    return tl.load(seq_row + keys, mask=keys < L, other=-1).to(tl.int64)


@jit
def _visible_slots(slots, i_blk, pos, row_ok, L, S, window, HAS_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """`_visible` of block i_blk, its `slots` loaded already (`_block_slots`)."""
    keys = i_blk * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] absolute key positions
    vis = (keys[None, :] <= pos[:, None]) & (keys[None, :] < L) & row_ok[:, None]  # [ROWS, BLOCK_N]
    if HAS_WINDOW:
        vis = vis & (keys[None, :] > pos[:, None] - window)
    vis = vis & _in_range(slots, S)[None, :]
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
def _combine(m_t, l_t, acc_t, m, l, acc, INTERPRETED: tl.constexpr):
    """The state of a row's spans so far (m_t, l_t, acc_t) after one more span's (m, l, acc): both rescaled to
    their common maximum and added, the span's products `settled` (rounded on their own) so that the one
    multiply-add left, t * a + (x * b), is the same instruction in every kernel that combines spans. A row that
    saw no key of the span (m = -inf) keeps the total."""
    m_new = tl.maximum(m_t, m)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = exp_ftz(m_t - m_safe, INTERPRETED)
    b = exp_ftz(m - m_safe, INTERPRETED)
    l_new = l_t * a + settled(l * b, INTERPRETED)
    acc_new = acc_t * a[:, None] + settled(acc * b[:, None], INTERPRETED)
    seen = m != float("-inf")
    return tl.where(seen, m_new, m_t), tl.where(seen, l_new, l_t), tl.where(seen[:, None], acc_new, acc_t)


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
    s = _scores(b_q, b_k, vis, scale, DOT_IN_FP32)
    m_new, m_safe, alpha = _running_max(m, s, DOT_IN_FP32)
    p, pv = _probs_times_v(s, m_safe, b_v, DOT_IN_FP32)
    l_new, acc_new = _fold(l, acc, alpha, p, pv, SUM_BY_DOT)
    return m_new, l_new, acc_new


@jit
def _block(
    m, l, acc, b_q, pos, row_ok, i_blk, seq_row, kv_head,
    k, v, L, S, scale, window,
    stride_ks, stride_kh, stride_vs, stride_vh,
    HAS_WINDOW: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr,
):
    """One online-softmax step of every row over key block i_blk, masked per row and key; a row that
    sees no key of the block keeps its state (selected, not updated)."""
    slots, vis, key_ok, row_active = _visible(i_blk, pos, row_ok, seq_row, L, S, window, HAS_WINDOW, BLOCK_N)
    b_k, b_v = _gather_kv(slots, key_ok, kv_head, k, v, stride_ks, stride_kh, stride_vs, stride_vh, D, DOT_IN_FP32)
    m_new, l_new, acc_new = _update(m, l, acc, b_q, b_k, b_v, vis, scale, DOT_IN_FP32, SUM_BY_DOT)
    m = tl.where(row_active, m_new, m)
    l = tl.where(row_active, l_new, l)
    acc = tl.where(row_active[:, None], acc_new, acc)
    return m, l, acc


@jit
def _diagonal_block(
    m, l, acc, b_q, pos_c, hi, i_blk, seq_row, kv_head, k, v, scale,
    stride_ks, stride_kh, stride_vs, stride_vh,
    D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr,
):
    """`_block` over a block that reaches the tile's positions (no window), where the caller has found the slot of
    every key up to the tile's last visible one (hi) in the store: there a row sees a key iff the key lies at or before
    the row's position clipped to the table (pos_c; -1 for a padding row), some row sees it iff it lies at or before
    hi (the tile's rows sit at consecutive positions), and a row sees a key of the block iff the block starts at or
    before pos_c. Those are `_visible`'s masks, computed without the slot compares and without the two reductions
    over the block; the same values follow."""
    keys = i_blk * BLOCK_N + tl.arange(0, BLOCK_N)
    key_ok = keys <= hi
    slots = tl.load(seq_row + keys, mask=key_ok, other=-1).to(tl.int64)
    b_k, b_v = _gather_kv(slots, key_ok, kv_head, k, v, stride_ks, stride_kh, stride_vs, stride_vh, D, DOT_IN_FP32)
    m_new, l_new, acc_new = _update(m, l, acc, b_q, b_k, b_v, keys[None, :] <= pos_c[:, None], scale, DOT_IN_FP32, SUM_BY_DOT)
    row_active = i_blk * BLOCK_N <= pos_c
    m = tl.where(row_active, m_new, m)
    l = tl.where(row_active, l_new, l)
    acc = tl.where(row_active[:, None], acc_new, acc)
    return m, l, acc


@jit
def _in_store(slots, S, CHECKED: tl.constexpr):
    """Which of a block's keys have their slot in the store [0, S): the constant true where CHECKED (the caller has
    found them all there)."""
    if CHECKED:
        return tl.full(slots.shape, 1, tl.int1)
    return _in_range(slots, S)


@jit
def _in_range(slots, S):
    """0 <= slots < S for int64 slots as one unsigned compare (a negative slot reads as one above every S): half the
    integer instructions of two signed 64-bit compares. S stays as given: a store of one slot makes it the constant 1
    (Triton specializes an integer argument of 1), which has no `.to`."""
    return slots.to(tl.uint64, bitcast=True) < S


@jit
def _slots_in_store(seq_row, lo, hi, S, SCAN: tl.constexpr):
    """Whether the slots of keys [lo, hi) all lie in the store [0, S): what lets a tile walk its whole blocks
    without a mask (`_full_block`'s CHECKED). One vector of SCAN slots a step, reduced once at the end."""
    offs = tl.arange(0, SCAN)
    outside = tl.zeros([SCAN], dtype=tl.int32)
    j = lo
    while j < hi:
        slots = tl.load(seq_row + j + offs, mask=j + offs < hi, other=0)
        outside |= tl.where(_in_range(slots.to(tl.int64), S), 0, 1)
        j += SCAN
    return tl.max(outside, 0) == 0


@jit
def _full_block(
    m, l, acc, b_q, i_blk, seq_row, kv_head, k, v, S, scale,
    stride_ks, stride_kh, stride_vs, stride_vh,
    D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr, CHECKED: tl.constexpr,
):
    """`_block` over a key block that lies wholly below every row's position (and inside the table):
    there a key is visible to a row iff its slot is in the store, the same for every row, so the
    per-row masks and their reductions drop out and `_update` gets the same values.

    `_block` keeps a row's state where the row sees no key of the block; here that case (every slot
    outside the store) needs no select, because the update leaves the state as it is: the maximum stays
    m, so alpha = exp(m - m) = exp(+0) = 1 exactly (ex2 of +0 is +1 in PTX; -inf rows get alpha = 0 with
    l = 0 and acc = +0), p = 0, l * 1 + 0 = l, and acc * 1 + (+0) = acc up to the sign of a zero, which
    the end's select discards. CHECKED: the caller found every slot of the block in the store (`_slots_in_store`),
    so `ok` is the constant true and its compares, selects and load masks compile away (the same values)."""
    keys = i_blk * BLOCK_N + tl.arange(0, BLOCK_N)
    slots = tl.load(seq_row + keys).to(tl.int64)
    ok = _in_store(slots, S, CHECKED)  # [BLOCK_N]
    b_k, b_v = _gather_kv(slots, ok, kv_head, k, v, stride_ks, stride_kh, stride_vs, stride_vh, D, DOT_IN_FP32)
    return _update(m, l, acc, b_q, b_k, b_v, ok[None, :], scale, DOT_IN_FP32, SUM_BY_DOT)


@jit
def _full_block_pair(
    m, l, acc, b_q, i_blk, seq_row, kv_head, k, v, S, scale,
    stride_ks, stride_kh, stride_vs, stride_vh,
    D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr, CHECKED: tl.constexpr,
):
    """`_full_block` over blocks i_blk and i_blk + 1, the same operations on the same values in the same
    fold order, written so that what does not wait on the first block's state does not wait for it: both
    blocks' loads and scores, then the running max through both (a max, exact), both blocks' p and p · V,
    and last the two folds of l and acc in block order. Only the dependency chain between two blocks is
    shorter (the second block's dots no longer wait for the first block's softmax)."""
    o_n = tl.arange(0, BLOCK_N)
    slots0 = tl.load(seq_row + i_blk * BLOCK_N + o_n).to(tl.int64)
    slots1 = tl.load(seq_row + (i_blk + 1) * BLOCK_N + o_n).to(tl.int64)
    ok0, ok1 = _in_store(slots0, S, CHECKED), _in_store(slots1, S, CHECKED)
    b_k0, b_v0 = _gather_kv(slots0, ok0, kv_head, k, v, stride_ks, stride_kh, stride_vs, stride_vh, D, DOT_IN_FP32)
    b_k1, b_v1 = _gather_kv(slots1, ok1, kv_head, k, v, stride_ks, stride_kh, stride_vs, stride_vh, D, DOT_IN_FP32)
    s0 = _scores(b_q, b_k0, ok0[None, :], scale, DOT_IN_FP32)
    s1 = _scores(b_q, b_k1, ok1[None, :], scale, DOT_IN_FP32)
    m0, m0_safe, alpha0 = _running_max(m, s0, DOT_IN_FP32)
    m1, m1_safe, alpha1 = _running_max(m0, s1, DOT_IN_FP32)
    p0, pv0 = _probs_times_v(s0, m0_safe, b_v0, DOT_IN_FP32)
    p1, pv1 = _probs_times_v(s1, m1_safe, b_v1, DOT_IN_FP32)
    l, acc = _fold(l, acc, alpha0, p0, pv0, SUM_BY_DOT)
    l, acc = _fold(l, acc, alpha1, p1, pv1, SUM_BY_DOT)
    return m1, l, acc


@jit
def _close_span(m, l, acc, m_t, l_t, acc_t, i_next, SPAN: tl.constexpr, INTERPRETED: tl.constexpr):
    """After the block before i_next: where a span of SPAN blocks ends there, the span's state combined into the
    total and restarted (-inf, 0, 0); elsewhere, both as they are."""
    if i_next % SPAN == 0:
        m_t, l_t, acc_t = _combine(m_t, l_t, acc_t, m, l, acc, INTERPRETED)
        m = tl.full(m.shape, float("-inf"), dtype=tl.float32)
        l = tl.zeros(l.shape, dtype=tl.float32)
        acc = tl.zeros(acc.shape, dtype=tl.float32)
    return m, l, acc, m_t, l_t, acc_t


@jit
def _masked_block(
    m, l, acc, b_q, pos, pos_c, row_ok, diag_hi, i_blk, seq_row, kv_head, k, v, L, S, scale, window,
    stride_ks, stride_kh, stride_vs, stride_vh,
    HAS_WINDOW: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr,
    DIAGONAL: tl.constexpr,
):
    """A block that is not whole for every row: `_diagonal_block` where DIAGONAL and the caller checked its slots
    (diag_hi >= 0), `_block` otherwise; the same values either way."""
    if DIAGONAL:
        if diag_hi >= 0:
            m, l, acc = _diagonal_block(m, l, acc, b_q, pos_c, diag_hi, i_blk, seq_row, kv_head, k, v, scale,
                                        stride_ks, stride_kh, stride_vs, stride_vh, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT)
        else:
            m, l, acc = _block(m, l, acc, b_q, pos, row_ok, i_blk, seq_row, kv_head, k, v, L, S, scale, window,
                               stride_ks, stride_kh, stride_vs, stride_vh, HAS_WINDOW, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT)
    else:
        m, l, acc = _block(m, l, acc, b_q, pos, row_ok, i_blk, seq_row, kv_head, k, v, L, S, scale, window,
                           stride_ks, stride_kh, stride_vs, stride_vh, HAS_WINDOW, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT)
    return m, l, acc


@jit
def _walk(
    b_q, pos, row_ok, lo_blk, full_blk, hi_blk, diag_hi, seq_row, kv_head, k, v, L, S, scale, window,
    stride_ks, stride_kh, stride_vs, stride_vh,
    HAS_WINDOW: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    SUM_BY_DOT: tl.constexpr, PAIRED: tl.constexpr, SPAN: tl.constexpr, CHECKED: tl.constexpr, DIAGONAL: tl.constexpr = False,
):
    """Every row's state (m, l, acc) after key blocks [lo_blk, hi_blk) in ascending order: [lo_blk, full_blk) whole
    (`_full_block`, two at a time where PAIRED), the rest masked per row (`_block`). SPAN > 0: the walk restarts
    after every SPAN absolute blocks and the returned state is the spans' combined in ascending order (`_combine`);
    a pair never straddles a span's end (PAIRED needs an even SPAN and, as every caller has, an even lo_blk). CHECKED:
    the caller found every slot of [lo_blk, full_blk) in the store. DIAGONAL and diag_hi >= 0: the caller found every
    slot up to key diag_hi, the tile's last visible key, in the store (no window), so [full_blk, hi_blk) take
    `_diagonal_block`. A row
    within its first span ends with that span's state combined into the empty total: exp(-inf) = 0 and exp(0) = 1
    give l and acc back as they are, but for a -0.0 in acc turned +0.0, which `_finish` does to every zero; so its
    output (and log-sum-exp) is the one-pass walk's."""
    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, D], dtype=tl.float32)
    m_t, l_t, acc_t = m, l, acc
    pos_c = tl.minimum(pos, L - 1)  # where DIAGONAL
    if DOT_IN_FP32:  # the interpreter cannot take a loaded scalar as a `range` bound
        i_blk = lo_blk
        while PAIRED and i_blk + 1 < full_blk:
            m, l, acc = _full_block_pair(m, l, acc, b_q, i_blk, seq_row, kv_head, k, v, S, scale,
                                         stride_ks, stride_kh, stride_vs, stride_vh, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT, CHECKED)
            i_blk += 2
            if SPAN > 0:
                m, l, acc, m_t, l_t, acc_t = _close_span(m, l, acc, m_t, l_t, acc_t, i_blk, SPAN, DOT_IN_FP32)
        while i_blk < full_blk:
            m, l, acc = _full_block(m, l, acc, b_q, i_blk, seq_row, kv_head, k, v, S, scale,
                                    stride_ks, stride_kh, stride_vs, stride_vh, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT, CHECKED)
            i_blk += 1
            if SPAN > 0:
                m, l, acc, m_t, l_t, acc_t = _close_span(m, l, acc, m_t, l_t, acc_t, i_blk, SPAN, DOT_IN_FP32)
        while i_blk < hi_blk:
            m, l, acc = _masked_block(m, l, acc, b_q, pos, pos_c, row_ok, diag_hi, i_blk, seq_row, kv_head, k, v, L, S, scale, window,
                                      stride_ks, stride_kh, stride_vs, stride_vh, HAS_WINDOW, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT,
                                      DIAGONAL)
            i_blk += 1
            if SPAN > 0:
                m, l, acc, m_t, l_t, acc_t = _close_span(m, l, acc, m_t, l_t, acc_t, i_blk, SPAN, DOT_IN_FP32)
    else:
        paired = lo_blk
        if PAIRED:
            paired = lo_blk + (full_blk - lo_blk) // 2 * 2
        for i_blk in range(lo_blk, paired, 2):
            m, l, acc = _full_block_pair(m, l, acc, b_q, i_blk, seq_row, kv_head, k, v, S, scale,
                                         stride_ks, stride_kh, stride_vs, stride_vh, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT, CHECKED)
            if SPAN > 0:
                m, l, acc, m_t, l_t, acc_t = _close_span(m, l, acc, m_t, l_t, acc_t, i_blk + 2, SPAN, DOT_IN_FP32)
        for i_blk in range(paired, full_blk):
            m, l, acc = _full_block(m, l, acc, b_q, i_blk, seq_row, kv_head, k, v, S, scale,
                                    stride_ks, stride_kh, stride_vs, stride_vh, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT, CHECKED)
            if SPAN > 0:
                m, l, acc, m_t, l_t, acc_t = _close_span(m, l, acc, m_t, l_t, acc_t, i_blk + 1, SPAN, DOT_IN_FP32)
        for i_blk in range(full_blk, hi_blk):
            m, l, acc = _masked_block(m, l, acc, b_q, pos, pos_c, row_ok, diag_hi, i_blk, seq_row, kv_head, k, v, L, S, scale, window,
                                      stride_ks, stride_kh, stride_vs, stride_vh, HAS_WINDOW, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT,
                                      DIAGONAL)
            if SPAN > 0:
                m, l, acc, m_t, l_t, acc_t = _close_span(m, l, acc, m_t, l_t, acc_t, i_blk + 1, SPAN, DOT_IN_FP32)
    if SPAN > 0:
        m, l, acc = _combine(m_t, l_t, acc_t, m, l, acc, DOT_IN_FP32)
    return m, l, acc
