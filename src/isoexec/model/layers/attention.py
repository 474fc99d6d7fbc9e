"""The `gqa` mixer: q/k/v projections, optional per-head q/k RMSNorm, rotary positions, causal GQA
attention over the layer's key store, o projection.

Shapes are local: heads are counted from the projections' outputs (`unflatten(1, (-1, head_dim))`) and tokens
from the attention's rows, so a model whose projections were sharded by heads from outside, or whose input
rows are a shard of the tokens (sequence parallelism), runs this code unchanged.
"""

import torch
from torch import Tensor, nn

from ..context import current_step
from ..spec import AttentionSpec
from .params import Linear, Norm, join, project


class Attention(nn.Module):
    name = "self_attn"
    SIBLINGS = (("q_proj", "k_proj", "v_proj"),)

    def __init__(self, spec: AttentionSpec, layer: int, hidden_size: int, eps: float, max_position: int, dtype: torch.dtype):
        super().__init__()
        self.layer, self.spec, self.eps, self.max_position = layer, spec, eps, max_position
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.q_proj = Linear(hidden_size, q * (2 if spec.output_gate else 1), spec.qkv_bias, dtype)
        self.k_proj = Linear(hidden_size, kv, spec.qkv_bias, dtype)
        self.v_proj = Linear(hidden_size, kv, spec.qkv_bias, dtype)
        self.o_proj = Linear(q, hidden_size, spec.o_bias, dtype)
        join(self.q_proj, self.k_proj, self.v_proj)
        if spec.qk_norm:
            self.q_norm = Norm(spec.head_dim, dtype)
            self.k_norm = Norm(spec.head_dim, dtype)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        s = current_step()
        ops, spec, batch = s.ops, self.spec, s.batch
        head_dim = spec.head_dim
        q, k, v = (t.unflatten(1, (-1, head_dim)) for t in project(("q_proj", "k_proj", "v_proj"), x, self.q_proj, self.k_proj, self.v_proj))
        # q [T, H, D] ([T, 2H, D] gated), k and v [T, Hkv, D]
        if spec.output_gate:  # per head: query, then gate
            q, gate = q.unflatten(1, (-1, 2)).unbind(2)
        q, k_store, v_store = self._rotate_and_store(q, k, v, positions)
        out = ops["self_attn"](q, k_store, v_store, batch.slot_table, batch.seq_ids, positions, head_dim**-0.5,
                               packed_len=batch.packed_len).flatten(1)  # [T, H D]
        if spec.output_gate:
            out = ops["attn_gate"](out, gate.flatten(1))
        return ops["o_proj"](out, self.o_proj.weight, self.o_proj.bias)

    def _rotate_and_store(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q and k normalised (with qk_norm) and rotated, k and v written to the layer's store: one launch where
        the binding offers it and it accepts the call (the same bits), else the separate ops."""
        s = current_step()
        ops, spec, store = s.ops, self.spec, s.state[self.layer]
        fused = ops.get("q_norm+k_norm+rotary_emb")  # the ops' names joined, as `params.project` names a joined op
        if fused is not None:
            weights = (self.q_norm.weight, self.k_norm.weight) if spec.qk_norm else None
            out = fused(q, k, v, positions, weights, self.eps, spec.zero_centered_qk_norm, spec.rope_theta, self.max_position, spec.rotary_dim,
                        store.cache(s.batch.write_slots))
            if out is not None:
                return out
        if spec.qk_norm:
            centred = (True,) if spec.zero_centered_qk_norm else ()
            q = ops["q_norm"](q, self.q_norm.weight, self.eps, *centred)
            k = ops["k_norm"](k, self.k_norm.weight, self.eps, *centred)
        rotary = () if spec.rotary_dim is None else (spec.rotary_dim,)
        q = ops["rotary_emb"](q, positions, spec.rope_theta, self.max_position, *rotary)
        k = ops["rotary_emb"](k, positions, spec.rope_theta, self.max_position, *rotary)
        return q, *store.store(k, v, s.batch.write_slots)
