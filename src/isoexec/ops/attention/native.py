"""The ordinary fast path: per sequence, gather its keys and call the backend's SDPA.

It computes the same function as the reference, but the backend picks its own blocking, reduction
order and kernel by shape (query length, key length), so a row's bits change with chunking, batching
and decode vs prefill. It is the baseline the bitwise checks must see fail.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype


def _sequence(q, k_store, v_store, slots, positions, scale, window):
    """q [n, H, D] of one sequence, slots [L] of its keys 0 … L-1 -> [n, H, D]."""
    num_heads, num_kv_heads = q.shape[1], k_store.shape[1]
    k = k_store[slots].transpose(0, 1).repeat_interleave(num_heads // num_kv_heads, dim=0)  # [H, L, D]
    v = v_store[slots].transpose(0, 1).repeat_interleave(num_heads // num_kv_heads, dim=0)
    keys = torch.arange(slots.shape[0], device=q.device)
    mask = keys <= positions[:, None]  # [n, L]
    if window is not None:
        mask = mask & (keys > positions[:, None] - window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scale)
    return out.transpose(0, 1)  # [n, H, D]


def attention(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
              scale: float, window: int | None = None, *, input_dtype: str, output_dtype: str, kv_cache_dtype: str) -> Tensor:
    """Same arguments and result as `reference.attention`, computed sequence by sequence with SDPA."""
    expect_dtype(q, input_dtype, "attention query")
    expect_dtype(k_store, kv_cache_dtype, "attention key store")
    expect_dtype(v_store, kv_cache_dtype, "attention value store")
    if q.dim() != 3 or k_store.shape != v_store.shape or k_store.dim() != 3 or q.shape[1] % max(1, k_store.shape[1]) or q.shape[2] != k_store.shape[2]:
        raise ValueError(f"attention: q {tuple(q.shape)} does not fit k_store {tuple(k_store.shape)} / v_store {tuple(v_store.shape)} (GQA needs H a multiple of Hkv)")
    out = q.new_zeros(q.shape)
    for b in torch.unique(seq_ids).tolist():
        rows = torch.nonzero(seq_ids == b).flatten()
        num_keys = min(int(positions[rows].max()) + 1, slot_table.shape[1])
        out = out.index_copy(0, rows, _sequence(q[rows], k_store, v_store, slot_table[b, :num_keys], positions[rows], scale, window))
    expect_dtype(out, output_dtype, "attention output")
    return out
