"""The `mla` mixer: multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash).

Per token the layer computes its query (`q_proj`, or `q_a_proj` -> `q_a_layernorm` -> `q_b_proj`), a
compressed latent and one rope key shared by every head (`kv_a_proj_with_mqa`, the latent normed by
`kv_a_layernorm`), and rotates the query's and the key's rope parts. The engine caches one row per token:
the latent then the rotated rope key (`LatentPages`), r + dr values where GQA would keep 2 · Hkv · D.
`mla_attn` attends over those rows with `kv_b_proj`'s weight; which algebraic form it computes (absorbed
or decompressed) is its impl's, the same in every case under a contract (`ops/mla/`).

`rope_interleave` checkpoints (DeepSeek-V3, GLM) pair rope dims (0, 1), (2, 3) …: the layer de-interleaves
them (evens then odds, a gather) and rotates in the `rotate_half` layout, which pairs the same values by
the same angles. Queries and keys are permuted alike, so their dot products are unchanged.
"""

import torch
from torch import Tensor, nn

from ..context import current_step
from ..spec import MLASpec
from .params import Linear, Norm, join, project


def deinterleave(x: Tensor) -> Tensor:
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


class MLAttention(nn.Module):
    name = "self_attn"

    def __init__(self, spec: MLASpec, layer: int, hidden_size: int, eps: float, max_position: int, dtype: torch.dtype):
        super().__init__()
        self.layer, self.spec, self.eps, self.max_position = layer, spec, eps, max_position
        heads, rank = spec.num_heads, spec.kv_lora_rank
        if spec.q_lora_rank is None:
            self.q_proj = Linear(hidden_size, heads * spec.qk_head_dim, False, dtype)
        else:
            self.q_a_proj = Linear(hidden_size, spec.q_lora_rank, spec.attention_bias, dtype)
            self.q_a_layernorm = Norm(spec.q_lora_rank, dtype)
            self.q_b_proj = Linear(spec.q_lora_rank, heads * spec.qk_head_dim, False, dtype)
        self.kv_a_proj_with_mqa = Linear(hidden_size, rank + spec.qk_rope_head_dim, spec.attention_bias, dtype)
        self.kv_a_layernorm = Norm(rank, dtype)
        self.kv_b_proj = Linear(rank, heads * (spec.qk_nope_head_dim + spec.v_head_dim), False, dtype)
        self.o_proj = Linear(heads * spec.v_head_dim, hidden_size, spec.attention_bias, dtype)
        self.first = "q_proj" if spec.q_lora_rank is None else "q_a_proj"  # the query's projection of x
        self.SIBLINGS = ((self.first, "kv_a_proj_with_mqa"),)
        join(getattr(self, self.first), self.kv_a_proj_with_mqa)

    def _rope(self, ops, x: Tensor, positions: Tensor) -> Tensor:
        spec = self.spec
        if spec.rope_interleave:
            x = deinterleave(x)
        scaling = () if spec.rope_scaling is None else (None, spec.rope_scaling)
        return ops["rotary_emb"](x, positions, spec.rope_theta, self.max_position, *scaling)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        s = current_step()
        ops, spec, batch = s.ops, self.spec, s.batch
        num_tokens, nope, rank = x.shape[0], spec.qk_nope_head_dim, spec.kv_lora_rank
        q, kv = project((self.first, "kv_a_proj_with_mqa"), x, getattr(self, self.first), self.kv_a_proj_with_mqa)  # kv [T, r + dr]
        if spec.q_lora_rank is not None:
            q = ops["q_b_proj"](ops["q_a_layernorm"](q, self.q_a_layernorm.weight, self.eps), self.q_b_proj.weight)
        q = q.unflatten(1, (-1, spec.qk_head_dim))  # [T, H, dn + dr]
        latent = ops["kv_a_layernorm"](kv[:, :rank], self.kv_a_layernorm.weight, self.eps)  # [T, r]
        q_rope = self._rope(ops, q[..., nope:], positions)  # [T, H, dr]
        k_rope = self._rope(ops, kv[:, None, rank:], positions)  # [T, 1, dr]
        rows = s.state[self.layer].store_latent(torch.cat([latent, k_rope[:, 0]], dim=-1), batch.write_slots)
        out = ops["mla_attn"](q[..., :nope], q_rope, rows, self.kv_b_proj.weight, batch.slot_table, batch.seq_ids, positions, spec.scale,
                              packed_len=batch.packed_len)  # [T, H, dv]
        return ops["o_proj"](out.reshape(num_tokens, -1), self.o_proj.weight, self.o_proj.bias)
