"""The ordinary fast path: the backend's SDPA, in one batched call for decode, per sequence otherwise.

It computes the same function as the reference, but the backend picks its own blocking, reduction
order and kernel by shape (query length, key length, batch), so a row's bits change with chunking,
batching and decode vs prefill. It is the baseline the bitwise checks must see fail, and the fast
baseline the benchmarks time, so it is written the way an ordinary engine would be:

- per row, when there are no more queries than sequences (decode): each query gathers its own keys
  `slot_table[seq_ids]` and all rows go through one SDPA call with a key mask. This is correct for any
  metadata, and decided from shapes alone, so it never waits on the device and can be captured in a
  CUDA graph;
- whole sequences packed back to back with their own keys, as the caller declares with `packed_len`
  (the trainer's batches, no window): one causal SDPA call (flash) over the sequences padded to the
  longest, `packed_len` rows each;
- per sequence otherwise (prefill): one SDPA call per sequence shares the key/value loads among its
  queries; a sequence whose queries are exactly positions 0 … n-1 without a window runs with
  `is_causal` (the flash kernel). Finding the sequences waits on the device.

SDPA gives NaN for a row whose mask hides every key, so such a row is shown one zeroed key (per row)
or its result is replaced by zero (per sequence): a row that sees no key is zero, as in the reference.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype


def _per_row(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
             scale: float, window: int | None) -> Tensor:
    """Every query against its own sequence's keys in one SDPA call; no host synchronisation."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_keys = k_store.shape[1], slot_table.shape[1]
    slots = slot_table[seq_ids]  # [T, L]
    keys = torch.arange(num_keys, device=q.device)
    p = positions[:, None]
    visible = (keys <= p) & (slots >= 0) & (slots < k_store.shape[0])  # [T, L]
    if window is not None:
        visible = visible & (keys > p - window)
    # Keys a row does not see may be unwritten cache slots holding NaN, and 0 · NaN is NaN inside the
    # kernel: zero them. A row seeing nothing is shown key 0, now zero, so its output is exactly 0.
    slots, hidden = slots.clamp(0, k_store.shape[0] - 1), ~visible[:, :, None, None]
    k = k_store[slots].masked_fill(hidden, 0).to(q.dtype).transpose(1, 2)  # [T, Hkv, L, D]
    v = v_store[slots].masked_fill(hidden, 0).to(q.dtype).transpose(1, 2)
    mask = visible.clone()
    mask[:, 0] |= ~visible.any(dim=1)
    # The query heads sharing a kv head become query rows of that head, so GQA needs no expanded K/V.
    group = num_heads // num_kv_heads
    out = F.scaled_dot_product_attention(q.reshape(num_tokens, num_kv_heads, group, head_dim), k, v,
                                         attn_mask=mask[:, None, None, :], scale=scale)  # [T, Hkv, G, D]
    return out.reshape(num_tokens, num_heads, head_dim)


def _sequence(q: Tensor, k_store: Tensor, v_store: Tensor, slots: Tensor, positions: Tensor, scale: float,
              window: int | None) -> Tensor:
    """q [n, H, D] of one sequence, slots [L] of its keys 0 … L-1 -> [n, H, D]."""
    num_heads, num_kv_heads = q.shape[1], k_store.shape[1]
    k = k_store[slots].transpose(0, 1).to(q.dtype)  # [Hkv, L, D]
    v = v_store[slots].transpose(0, 1).to(q.dtype)
    num_queries, num_keys = q.shape[0], slots.shape[0]
    # Expanded K/V heads rather than `enable_gqa`, which kept bf16 on SDPA's fp32 math backend on an H200.
    group = num_heads // num_kv_heads
    k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    if window is None and num_queries == num_keys and torch.equal(positions, torch.arange(num_keys, device=q.device)):
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True, scale=scale)
        return out.transpose(0, 1)
    keys = torch.arange(num_keys, device=q.device)
    mask = keys <= positions[:, None]  # [n, L]
    if window is not None:
        mask = mask & (keys > positions[:, None] - window)
    has_keys = mask.any(dim=1)  # [n]
    mask[:, 0] |= ~has_keys
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, scale=scale)
    return torch.where(has_keys[:, None, None], out.transpose(0, 1), 0.0)


def packed(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
            scale: float, longest: int) -> Tensor:
    """Packed whole sequences in one causal SDPA call: each sequence padded to `longest` rows at its end,
    where only padding queries see the padding keys."""
    num_tokens, num_heads, head_dim = q.shape
    num_seqs, group = slot_table.shape[0], num_heads // k_store.shape[1]
    dest = seq_ids * longest + positions  # [T] row in the padded batch

    def padded(t: Tensor) -> Tensor:  # [T, h, D] -> [B, h, longest, D]
        rows = t.new_zeros(num_seqs * longest, *t.shape[1:]).index_copy(0, dest, t.to(q.dtype))
        return rows.view(num_seqs, longest, *t.shape[1:]).transpose(1, 2)

    k, v = padded(k_store).repeat_interleave(group, dim=1), padded(v_store).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(padded(q), k, v, is_causal=True, scale=scale)  # [B, H, longest, D]
    return out.transpose(1, 2).reshape(num_seqs * longest, num_heads, head_dim)[dest]


def _per_sequence(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
                  scale: float, window: int | None) -> Tensor:
    out = q.new_zeros(q.shape)
    for b in torch.unique(seq_ids).tolist():
        rows = torch.nonzero(seq_ids == b).flatten()
        num_keys = min(int(positions[rows].max()) + 1, slot_table.shape[1])
        if num_keys > 0:
            out = out.index_copy(0, rows, _sequence(q[rows], k_store, v_store, slot_table[b, :num_keys], positions[rows], scale, window))
    return out


def attention(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
              scale: float, window: int | None = None, packed_len: int | None = None, *, input_dtype: str, output_dtype: str,
              kv_cache_dtype: str) -> Tensor:
    """Same arguments and result as `reference.attention`, computed with SDPA (per row, packed or per sequence)."""
    expect_dtype(q, input_dtype, "attention query")
    expect_dtype(k_store, kv_cache_dtype, "attention key store")
    expect_dtype(v_store, kv_cache_dtype, "attention value store")
    if q.dim() != 3 or k_store.shape != v_store.shape or k_store.dim() != 3 or q.shape[1] % max(1, k_store.shape[1]) or q.shape[2] != k_store.shape[2]:
        raise ValueError(f"attention: q {tuple(q.shape)} does not fit k_store {tuple(k_store.shape)} / v_store {tuple(v_store.shape)} (GQA needs H a multiple of Hkv)")
    if q.shape[0] == 0 or slot_table.shape[1] == 0 or k_store.shape[0] == 0:
        out = q.new_zeros(q.shape)
    elif q.shape[0] <= slot_table.shape[0]:
        out = _per_row(q, k_store, v_store, slot_table, seq_ids, positions, scale, window)
    elif window is None and packed_len is not None:
        out = packed(q, k_store, v_store, slot_table, seq_ids, positions, scale, packed_len)
    else:
        out = _per_sequence(q, k_store, v_store, slot_table, seq_ids, positions, scale, window)
    expect_dtype(out, output_dtype, "attention output")
    return out
