"""Multi-head latent attention in the absorbed form, one op order for training, prefill and decode.

A row's keys are never decompressed: the query's no-position part is taken into the latent space
(`q_lat = W_UKᵀ q_nope`), the row attends over the cached (latent, rope key) rows as MQA with one
key/value head (values: the latent part), and the result leaves the latent space through W_UV. The
three steps are `linear.reference`, `attention.reference`'s block walk and `linear.reference` again,
so a row's bits depend only on its own query, its sequence's rows and its absolute position
(README.md has the op order). Decompressing for prefill and absorbing for decode, as engines do,
rounds at other points: exactly the mismatch this impl does not have.

The backward pass is plain autograd over the same ops: gradients are correct, not invariant.
"""

import torch
from torch import Tensor

from ..attention.reference import _attend_rows
from ..common import TILE_ELEMENTS, expect_dtype, torch_dtype
from ..linear.reference import linear


def check_constants(constants: dict) -> None:
    """Refuse split-KV at resolve time: the block walk visits every key block of a row in one pass."""
    split_kv_size = constants.get("split_kv_size", 0)
    if split_kv_size != 0:
        raise ValueError(f"mla.reference does not split the keys: split_kv_size must be 0, got {split_kv_size}")


def head_dims(q_nope: Tensor, q_rope: Tensor, latent_store: Tensor, kv_b_weight: Tensor) -> tuple[int, int, int, int, int]:
    """(H, dn, dr, r, dv) of a call, or a ValueError naming the tensor that does not fit."""
    if q_nope.dim() != 3 or q_rope.dim() != 3 or q_nope.shape[:2] != q_rope.shape[:2]:
        raise ValueError(f"mla: q_nope and q_rope must be [T, H, dn] and [T, H, dr], got {tuple(q_nope.shape)} and {tuple(q_rope.shape)}")
    num_heads, nope, rope = q_nope.shape[1], q_nope.shape[2], q_rope.shape[2]
    if latent_store.dim() != 2 or latent_store.shape[1] <= rope:
        raise ValueError(f"mla: latent_store must be [S, r + dr] with r > 0 and dr = {rope}, got {tuple(latent_store.shape)}")
    rank = latent_store.shape[1] - rope
    if kv_b_weight.dim() != 2 or kv_b_weight.shape[1] != rank:
        raise ValueError(f"mla: kv_b_weight must be [H * (dn + dv), r] with r = {rank}, got {tuple(kv_b_weight.shape)}")
    if num_heads == 0 or kv_b_weight.shape[0] % num_heads or kv_b_weight.shape[0] // num_heads <= nope:
        raise ValueError(f"mla: kv_b_weight's {kv_b_weight.shape[0]} rows are not {num_heads} heads of dn + dv with dn = {nope}, dv > 0")
    return num_heads, nope, rope, rank, kv_b_weight.shape[0] // num_heads - nope


def check_inputs(q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions, input_dtype, kv_cache_dtype, weight_dtype):
    """Shapes and dtypes of a call (shared with `native`); -> (H, dn, dr, r, dv)."""
    expect_dtype(q_nope, input_dtype, "mla q_nope")
    expect_dtype(q_rope, input_dtype, "mla q_rope")
    expect_dtype(latent_store, kv_cache_dtype, "mla latent_store")
    expect_dtype(kv_b_weight, weight_dtype, "mla kv_b_weight")
    dims = head_dims(q_nope, q_rope, latent_store, kv_b_weight)
    for name, t, rank in (("slot_table", slot_table, 2), ("seq_ids", seq_ids, 1), ("positions", positions, 1)):
        if t.dim() != rank or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"mla: {name} must be a {rank}-D integer tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if seq_ids.shape[0] != q_nope.shape[0] or positions.shape[0] != q_nope.shape[0]:
        raise ValueError(f"mla: {q_nope.shape[0]} queries but {seq_ids.shape[0]} seq_ids and {positions.shape[0]} positions")
    return dims


def mla_attn(q_nope: Tensor, q_rope: Tensor, latent_store: Tensor, kv_b_weight: Tensor, slot_table: Tensor, seq_ids: Tensor,
             positions: Tensor, scale: float, packed_len: int | None = None, *, input_dtype: str, output_dtype: str, kv_cache_dtype: str,
             weight_dtype: str, accum_dtype: str, block_n: int, reduce_block: int, block_tree: str, block_k: int, tree: str,
             split_kv_size: int) -> Tensor:
    """Causal multi-head latent attention over a store of (latent, rope key) rows addressed by slots.

    q_nope [T, H, dn], q_rope [T, H, dr] (rotated); latent_store [S, r + dr]: per slot the normed latent
    c then the rotated shared rope key; kv_b_weight [H * (dn + dv), r] (`kv_b_proj.weight`: per head dn
    rows of W_UK, then dv of W_UV). slot_table, seq_ids, positions as `attention`: the query at p sees
    keys j <= p of its sequence. Score: scale * (q_nope · W_UK c_j + q_rope · k_rope_j); value W_UV c_j.
    Returns [T, H, dv] in output_dtype; a row that sees no key is zero. `packed_len` never changes a bit here.
    """
    check_constants({"split_kv_size": split_kv_size})
    num_heads, nope, _, rank, _ = check_inputs(q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions, input_dtype,
                                               kv_cache_dtype, weight_dtype)
    gemm = dict(weight_dtype=weight_dtype, accum_dtype=accum_dtype, block_k=block_k, block_tree=block_tree, tree=tree)
    weight = kv_b_weight.unflatten(0, (num_heads, -1))  # [H, dn + dv, r]
    w_uk, w_uv = weight[:, :nope], weight[:, nope:]  # [H, dn, r], [H, dv, r]
    q_lat = torch.stack([linear(q_nope[:, h], w_uk[h].T, input_dtype=input_dtype, output_dtype=input_dtype, **gemm)
                         for h in range(num_heads)], dim=1)  # [T, H, r]
    query = torch.cat([q_lat, q_rope], dim=-1)  # [T, H, r + dr]
    keys, values = latent_store[:, None], latent_store[:, None, :rank]  # [S, 1, r + dr], [S, 1, r]
    accum, table = torch_dtype(accum_dtype), slot_table[seq_ids]  # [T, L]
    # Tiling over query rows only bounds memory; a row's arithmetic is the same in any tile.
    rows = max(1, TILE_ELEMENTS // max(1, num_heads * block_n * latent_store.shape[1]))
    tiles = [_attend_rows(query[r0 : r0 + rows], keys, values, table[r0 : r0 + rows], positions[r0 : r0 + rows], scale, None, accum,
                          block_n, reduce_block, block_tree) for r0 in range(0, query.shape[0], rows)]
    o_lat = (torch.cat(tiles) if tiles else query.new_zeros((0, num_heads, rank), dtype=accum)).to(torch_dtype(input_dtype))  # [T, H, r]
    return torch.stack([linear(o_lat[:, h], w_uv[h], input_dtype=input_dtype, output_dtype=output_dtype, **gemm)
                        for h in range(num_heads)], dim=1)  # [T, H, dv]
