"""The ordinary fast path, as vLLM-style engines run MLA: two algebraic forms, picked by shape.

- decode (no more queries than sequences, decided from shapes alone: no host sync, graph-capturable):
  the absorbed form with plain torch ops in the activation dtype. q_nope is taken into the latent
  space by an einsum with W_UK, scores are one matmul against the gathered (latent, rope key) rows,
  the softmax runs in fp32 (at least) and is cast back, the values are the latent rows, and an einsum with W_UV
  brings the result out;
- otherwise (prefill, and the trainer's packed batches): the decompressed form. The latent rows a call
  needs are expanded to per-head keys and values by `F.linear(c, kv_b_weight)`, the shared rope key is
  broadcast to every head, and SDPA runs per sequence (`is_causal` where the queries are exactly
  positions 0 … n-1) or, for a batch the caller declares packed (`packed_len`), once over the
  sequences padded to the longest.

The two forms round at different points (k_nope = W_UK c in bf16 against q_lat = W_UKᵀ q in bf16), so a
token's output changes bits between decode and prefill or training on any hardware: the mismatch
`mla.reference` removes, and the baseline the bitwise checks must see fail.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype
from .reference import head_dims


def _absorbed(q_nope: Tensor, q_rope: Tensor, latent_store: Tensor, w_uk: Tensor, w_uv: Tensor, slot_table: Tensor, seq_ids: Tensor,
              positions: Tensor, scale: float) -> Tensor:
    """Every query against its own sequence's rows, in one batched pass; no host synchronisation."""
    rank, num_slots = w_uk.shape[-1], latent_store.shape[0]
    slots = slot_table[seq_ids]  # [T, L]
    keys = torch.arange(slot_table.shape[1], device=q_nope.device)
    visible = (keys <= positions[:, None]) & (slots >= 0) & (slots < num_slots)  # [T, L]
    # Unwritten slots may hold NaN, and 0 · NaN is NaN in the matmul: zero them first.
    rows = latent_store[slots.clamp(0, num_slots - 1)].masked_fill(~visible[..., None], 0).to(q_nope.dtype)  # [T, L, r + dr]
    q_lat = torch.einsum("thd,hdr->thr", q_nope, w_uk.to(q_nope.dtype))  # [T, H, r]
    softmax_dtype = torch.promote_types(q_nope.dtype, torch.float32)
    scores = torch.matmul(torch.cat([q_lat, q_rope], dim=-1), rows.transpose(1, 2)).to(softmax_dtype) * scale  # [T, H, L]
    # A row seeing nothing is shown key 0, now zero, so its output is exactly 0 (not softmax's NaN).
    mask = visible.clone()
    mask[:, 0] |= ~visible.any(dim=1)
    probs = torch.softmax(scores.masked_fill(~mask[:, None], float("-inf")), dim=-1).to(q_nope.dtype)
    o_lat = torch.matmul(probs, rows[..., :rank])  # [T, H, r]
    return torch.einsum("thr,hvr->thv", o_lat, w_uv.to(q_nope.dtype))


def _decompress(rows: Tensor, kv_b_weight: Tensor, num_heads: int, nope: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """rows [n, r + dr] -> keys [n, H, dn + dr], values [n, H, dv] in `dtype`, as kv_b_proj computes them."""
    rank = kv_b_weight.shape[1]
    kv = F.linear(rows[:, :rank].to(dtype), kv_b_weight.to(dtype)).unflatten(1, (num_heads, -1))  # [n, H, dn + dv]
    k_rope = rows[:, None, rank:].to(dtype).expand(-1, num_heads, -1)  # [n, H, dr]
    return torch.cat([kv[..., :nope], k_rope], dim=-1), kv[..., nope:]


def _packed(q: Tensor, latent_store: Tensor, kv_b_weight: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor, scale: float,
            longest: int, nope: int) -> Tensor:
    """Packed whole sequences over their own rows (the store is the batch) in one causal SDPA call,
    each sequence padded to `longest` rows at its end, where only padding queries see padding keys."""
    num_tokens, num_heads = q.shape[:2]
    num_seqs = slot_table.shape[0]
    dest = seq_ids * longest + positions  # [T] row in the padded batch
    k, v = _decompress(latent_store, kv_b_weight, num_heads, nope, q.dtype)

    def padded(t: Tensor) -> Tensor:  # [T, H, E] -> [B, H, longest, E]
        rows = t.new_zeros(num_seqs * longest, *t.shape[1:]).index_copy(0, dest, t)
        return rows.view(num_seqs, longest, *t.shape[1:]).transpose(1, 2)

    out = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), is_causal=True, scale=scale)  # [B, H, longest, dv]
    return out.transpose(1, 2).reshape(num_seqs * longest, num_heads, -1)[dest]


def _sequence(q: Tensor, rows: Tensor, kv_b_weight: Tensor, positions: Tensor, scale: float, nope: int) -> Tensor:
    """q [n, H, dn + dr] of one sequence, rows [L, r + dr] of its keys 0 … L-1 -> [n, H, dv]."""
    k, v = (t.transpose(0, 1) for t in _decompress(rows, kv_b_weight, q.shape[1], nope, q.dtype))  # [H, L, ·]
    num_queries, num_keys = q.shape[0], rows.shape[0]
    if num_queries == num_keys and torch.equal(positions, torch.arange(num_keys, device=q.device)):
        return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True, scale=scale).transpose(0, 1)
    mask = torch.arange(num_keys, device=q.device) <= positions[:, None]  # [n, L]
    has_keys = mask.any(dim=1)
    mask[:, 0] |= ~has_keys
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, scale=scale).transpose(0, 1)
    return torch.where(has_keys[:, None, None], out, 0.0)


def _per_sequence(q: Tensor, latent_store: Tensor, kv_b_weight: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
                  scale: float, nope: int, value_dim: int) -> Tensor:
    out = q.new_zeros((q.shape[0], q.shape[1], value_dim))
    for b in torch.unique(seq_ids).tolist():
        rows = torch.nonzero(seq_ids == b).flatten()
        num_keys = min(int(positions[rows].max()) + 1, slot_table.shape[1])
        if num_keys > 0:
            keys = latent_store[slot_table[b, :num_keys]]  # [L, r + dr]
            out = out.index_copy(0, rows, _sequence(q[rows], keys, kv_b_weight, positions[rows], scale, nope))
    return out


def mla_attn(q_nope: Tensor, q_rope: Tensor, latent_store: Tensor, kv_b_weight: Tensor, slot_table: Tensor, seq_ids: Tensor,
             positions: Tensor, scale: float, packed_len: int | None = None, *, input_dtype: str, output_dtype: str) -> Tensor:
    """Same arguments and result as `reference.mla_attn`: absorbed for decode, decompressed otherwise."""
    expect_dtype(q_nope, input_dtype, "mla q_nope")
    expect_dtype(q_rope, input_dtype, "mla q_rope")
    num_heads, nope, _, _, value_dim = head_dims(q_nope, q_rope, latent_store, kv_b_weight)
    num_tokens = q_nope.shape[0]
    if num_tokens == 0 or slot_table.shape[1] == 0 or latent_store.shape[0] == 0:
        out = q_nope.new_zeros((num_tokens, num_heads, value_dim))
    elif num_tokens <= slot_table.shape[0]:
        weight = kv_b_weight.unflatten(0, (num_heads, -1))  # [H, dn + dv, r]
        out = _absorbed(q_nope, q_rope, latent_store, weight[:, :nope], weight[:, nope:], slot_table, seq_ids, positions, scale)
    else:
        q = torch.cat([q_nope, q_rope], dim=-1)  # [T, H, dn + dr]
        if packed_len is not None:
            out = _packed(q, latent_store, kv_b_weight, slot_table, seq_ids, positions, scale, packed_len, nope)
        else:
            out = _per_sequence(q, latent_store, kv_b_weight, slot_table, seq_ids, positions, scale, nope, value_dim)
    expect_dtype(out, output_dtype, "mla output")
    return out
