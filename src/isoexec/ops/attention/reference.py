"""Attention whose row bits depend only on that row's query, its keys and its absolute position.

The query at absolute position p walks the keys in fixed absolute blocks [0, B), [B, 2B) … in
ascending order with one fp32 online softmax, whether the row sits in a packed training batch, a
prefill chunk or a decode step: the forms differ only in the integer metadata (see `metadata.py`).
The op order per block is written out in README.md; nothing in it depends on T, on the other rows,
on how keys are laid out in the store, or on which blocks other rows needed. With `split_kv_size` S > 0
the walk restarts at every absolute span [0, S), [S, 2S) … and the spans' states are combined in
ascending order (`_combine`), so a decode step may walk its spans in parallel and get the same bits.

The backward pass is plain autograd over the same ops: gradients are correct, not invariant.
"""

import torch
from torch import Tensor

from ..common import TILE_ELEMENTS, expect_dtype, torch_dtype
from ..reduce import blocked_sum, tree_max, tree_sum

NEG_INF = float("-inf")


def check_constants(constants: dict) -> None:
    """split_kv_size: 0 (one walk per row) or a multiple of block_n (absolute spans of whole key blocks)."""
    check_split("attention.reference", constants.get("split_kv_size", 0), constants.get("block_n", 1))


def check_split(impl_id: str, split_kv_size: int, block_n: int) -> None:
    if split_kv_size < 0 or split_kv_size % block_n:
        raise ValueError(f"{impl_id}: split_kv_size must be 0 or a positive multiple of block_n ({block_n}), got {split_kv_size}")


def _check_inputs(q, k_store, v_store, slot_table, seq_ids, positions, window, input_dtype, kv_cache_dtype):
    expect_dtype(q, input_dtype, "attention query")
    expect_dtype(k_store, kv_cache_dtype, "attention key store")
    expect_dtype(v_store, kv_cache_dtype, "attention value store")
    if q.dim() != 3 or k_store.dim() != 3 or v_store.dim() != 3:
        raise ValueError(f"attention: q must be [T, H, D] and k_store, v_store [S, Hkv, D], got {tuple(q.shape)}, {tuple(k_store.shape)}, {tuple(v_store.shape)}")
    if k_store.shape != v_store.shape:
        raise ValueError(f"attention: k_store {tuple(k_store.shape)} and v_store {tuple(v_store.shape)} differ in shape")
    num_heads, num_kv_heads = q.shape[1], k_store.shape[1]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"attention: {num_heads} query heads are not a multiple of {num_kv_heads} key/value heads")
    if q.shape[2] != k_store.shape[2]:
        raise ValueError(f"attention: q has head dim {q.shape[2]}, k_store/v_store have {k_store.shape[2]}")
    for name, t, dims in (("slot_table", slot_table, 2), ("seq_ids", seq_ids, 1), ("positions", positions, 1)):
        if t.dim() != dims or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"attention: {name} must be a {dims}-D integer tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if seq_ids.shape[0] != q.shape[0] or positions.shape[0] != q.shape[0]:
        raise ValueError(f"attention: {q.shape[0]} queries but {seq_ids.shape[0]} seq_ids and {positions.shape[0]} positions")
    if window is not None and window < 1:
        raise ValueError(f"attention: window must be at least 1 (the query's own key), got {window}")


def _visible(keys: Tensor, positions: Tensor, window: int | None, num_keys: int) -> Tensor:
    """keys [N] absolute key positions, positions [T] -> [T, N]: may the query see the key?"""
    p = positions[:, None]
    visible = (keys <= p) & (keys < num_keys)
    if window is not None:
        visible = visible & (keys > p - window)
    return visible


def _block_range(positions: Tensor, window: int | None, block_n: int, num_keys: int) -> range:
    """The absolute key blocks holding any row's visible keys. Walking fewer or more blocks than
    these never changes a row's bits: a block with no visible key leaves the row's state untouched."""
    lo = (positions - window + 1).clamp(min=0) if window is not None else torch.zeros_like(positions)
    hi = positions.clamp(max=num_keys - 1)
    has_keys = lo <= hi  # [T]
    if not bool(has_keys.any()):
        return range(0)
    return range(int(lo[has_keys].min()) // block_n, int(hi[has_keys].max()) // block_n + 1)


def _gather_block(store: Tensor, slots: Tensor, visible: Tensor, accum: torch.dtype) -> Tensor:
    """store [S, Hkv, D], slots/visible [T, N] -> [T, Hkv, N, D] in `accum`, +0.0 where not visible.

    Invisible slots may be -1 or hold NaN/inf (unused cache pages, keys not written yet); `where`
    removes them before any arithmetic, so neither the output nor the gradient ever sees them.
    """
    rows = store[slots.clamp(0, store.shape[0] - 1)].to(accum)  # [T, N, Hkv, D]
    rows = torch.where(visible[:, :, None, None], rows, 0.0)
    return rows.transpose(1, 2)


def _block_update(state, qf, k, v, visible, scale, reduce_block, block_tree):
    """One online-softmax step over one key block for every row; rows that see none of its keys
    keep their state bit for bit (selected by `where`, so a -0.0 in acc survives)."""
    m, l, acc = state  # [T, H], [T, H], [T, H, D]
    num_tokens, num_kv_heads, group = qf.shape[:3]
    num_heads = num_kv_heads * group
    block = visible.shape[1]
    mask = visible[:, None, :]  # [T, 1, N]

    scores = blocked_sum(qf * k[:, :, None], reduce_block, block_tree, "sequential")  # [T, Hkv, G, N]
    scores = scores.reshape(num_tokens, num_heads, block) * scale
    scores = torch.where(mask, scores, NEG_INF)  # [T, H, N]

    m_new = torch.maximum(m, tree_max(scores, block_tree))
    # -inf - -inf would be NaN (and poison the gradient); a row whose max is still -inf has p = 0.
    m_safe = torch.where(m_new == NEG_INF, 0.0, m_new)
    alpha = torch.exp(m - m_safe)
    p = torch.where(mask, torch.exp(scores - m_safe[..., None]), 0.0)  # [T, H, N]
    l_new = l * alpha + tree_sum(p, block_tree)

    pv = p.reshape(num_tokens, num_kv_heads, group, 1, block) * v.transpose(-1, -2)[:, :, None]  # [T, Hkv, G, D, N]
    pv = torch.where(visible[:, None, None, None, :], pv, 0.0)
    acc_new = acc * alpha[..., None] + tree_sum(pv, block_tree).reshape(num_tokens, num_heads, -1)

    active = visible.any(dim=1)[:, None]  # [T, 1]
    return torch.where(active, m_new, m), torch.where(active, l_new, l), torch.where(active[..., None], acc_new, acc)


def _combine(total, part):
    """The state of the spans so far after one more span's: both rescaled to their common maximum and added,
    the span's product rounded before the add (`acc * b` on its own, then `A * a + it`: one multiply-add on a
    GPU). A row that saw no key of the span keeps the total bit for bit."""
    m_t, l_t, acc_t = total
    m, l, acc = part
    m_new = torch.maximum(m_t, m)
    m_safe = torch.where(m_new == NEG_INF, 0.0, m_new)
    a, b = torch.exp(m_t - m_safe), torch.exp(m - m_safe)
    l_new = l_t * a + l * b
    acc_new = acc_t * a[..., None] + acc * b[..., None]
    seen = m != NEG_INF
    return torch.where(seen, m_new, m_t), torch.where(seen, l_new, l_t), torch.where(seen[..., None], acc_new, acc_t)


def _attend_rows(q, k_store, v_store, table, positions, scale, window, accum, block_n, reduce_block, block_tree, span_blocks=0):
    """q [T, H, D], v_store [S, Hkv, Dv] with table [T, L] (the slot row of each query) -> [T, H, Dv] in
    `accum`. Dv may differ from D (MLA's values are its keys' latent part). span_blocks > 0: the walk restarts
    after every span of that many absolute blocks, each span's state combined into the total (`_combine`)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_keys = k_store.shape[1], table.shape[1]
    qf = q.to(accum).reshape(num_tokens, num_kv_heads, num_heads // num_kv_heads, 1, head_dim)
    scale = torch.tensor(scale, dtype=accum, device=q.device)

    def fresh():
        return (qf.new_full((num_tokens, num_heads), NEG_INF), qf.new_zeros((num_tokens, num_heads)),
                qf.new_zeros((num_tokens, num_heads, v_store.shape[-1])))

    m, l, acc = fresh()
    total = fresh()
    for t in _block_range(positions, window, block_n, num_keys):
        keys = torch.arange(t * block_n, (t + 1) * block_n, device=q.device)  # [N]
        visible = _visible(keys, positions, window, num_keys)  # [T, N]
        slots = table[:, keys.clamp(max=num_keys - 1)]  # [T, N]
        if bool((visible & ((slots < 0) | (slots >= k_store.shape[0]))).any()):
            raise ValueError(f"attention: a visible key in block [{t * block_n}, {(t + 1) * block_n}) has a slot outside the key/value store")
        k = _gather_block(k_store, slots, visible, accum)
        v = _gather_block(v_store, slots, visible, accum)
        m, l, acc = _block_update((m, l, acc), qf, k, v, visible, scale, reduce_block, block_tree)
        if span_blocks and (t + 1) % span_blocks == 0:
            total, (m, l, acc) = _combine(total, (m, l, acc)), fresh()
    if span_blocks:
        m, l, acc = _combine(total, (m, l, acc))
    has_keys = (l > 0)[..., None]  # [T, H, 1]
    return torch.where(has_keys, acc / torch.where(has_keys, l[..., None], 1.0), 0.0)


def attention(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
              scale: float, window: int | None = None, packed_len: int | None = None, *, input_dtype: str, output_dtype: str,
              kv_cache_dtype: str, accum_dtype: str, block_n: int, reduce_block: int, block_tree: str, split_kv_size: int) -> Tensor:
    """Causal (optionally sliding-window) GQA attention over a key/value store addressed by slots.

    q [T, H, D]; k_store, v_store [S, Hkv, D] with H a multiple of Hkv (head h reads kv head
    h // (H // Hkv)); slot_table [B, L]: row of the store holding key j of sequence b; seq_ids [T]:
    each query's sequence; positions [T]: each query's absolute position p. The query sees keys j with
    j <= p, j < L and, with a window, j > p - window. Returns [T, H, D] in output_dtype; a row that
    sees no key is zero. `packed_len`, where the caller declares a packed batch of whole sequences (the
    longest of them), may let an impl pick a faster layout; a row's bits here never depend on it.
    """
    check_constants({"split_kv_size": split_kv_size, "block_n": block_n})
    _check_inputs(q, k_store, v_store, slot_table, seq_ids, positions, window, input_dtype, kv_cache_dtype)
    accum = torch_dtype(accum_dtype)
    table = slot_table[seq_ids]  # [T, L]
    # Tiling over query rows only bounds memory; a row's arithmetic is the same in any tile.
    rows = max(1, TILE_ELEMENTS // max(1, q.shape[1] * block_n * q.shape[2]))
    tiles = [
        _attend_rows(q[r0 : r0 + rows], k_store, v_store, table[r0 : r0 + rows], positions[r0 : r0 + rows], scale, window,
                     accum, block_n, reduce_block, block_tree, split_kv_size // block_n)
        for r0 in range(0, q.shape[0], rows)
    ]
    out = torch.cat(tiles) if tiles else q.new_zeros(q.shape, dtype=accum)
    return out.to(torch_dtype(output_dtype))
