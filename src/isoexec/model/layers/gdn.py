"""The `gdn` mixer: Gated DeltaNet (Qwen3-Next and Qwen3.5's `linear_attention` layers).

Per token: `in_proj_qkv` -> the depthwise causal conv + SiLU (`conv1d`) -> q, k (Hk heads of Dk) and v
(Hv heads of Dv); `in_proj_b` and `in_proj_a` give the delta rule's β and decay inputs, which `gdn_core`
gates in fp32 with `A_log` and `dt_bias`; its output [T, Hv, Dv] is normed per head and multiplied by
silu(z) (`gated_norm`, z from `in_proj_z`), and `out_proj` takes it back to the hidden size.

In a trainer forward every sequence starts from a zero state and the conv sees only its own tokens. In
the engine the layer's state (`RecurrentState`) is per sequence, in the slots the batch names
(`batch.state_ids`): the conv's last inputs, the fp32 state at the open chunk's start and the open
chunk's rows, read and written by the ops in place (`ops/gdn/`).
"""

import torch
from torch import Tensor, nn

from ..context import current_step
from ..spec import GDNSpec
from ..state import PACKED
from .params import Linear, Norm, join, project


class Conv(nn.Module):
    """conv1d.weight [conv_dim, 1, W] as transformers' depthwise nn.Conv1d stores it (no bias)."""

    def __init__(self, channels: int, width: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, width, dtype=dtype))


class GatedDeltaNet(nn.Module):
    name = "linear_attn"
    SIBLINGS = (("in_proj_qkv", "in_proj_z"), ("in_proj_b", "in_proj_a"))

    def __init__(self, spec: GDNSpec, layer: int, hidden_size: int, eps: float, max_position: int, dtype: torch.dtype):
        super().__init__()
        self.layer, self.spec, self.eps = layer, spec, eps
        self.in_proj_qkv = Linear(hidden_size, spec.conv_dim, False, dtype)
        self.in_proj_z = Linear(hidden_size, spec.value_dim, False, dtype)
        self.in_proj_b = Linear(hidden_size, spec.num_v_heads, False, dtype)
        self.in_proj_a = Linear(hidden_size, spec.num_v_heads, False, dtype)
        self.conv1d = Conv(spec.conv_dim, spec.conv_kernel, dtype)
        self.dt_bias = nn.Parameter(torch.ones(spec.num_v_heads, dtype=dtype))
        self.A_log = nn.Parameter(torch.zeros(spec.num_v_heads, dtype=dtype))
        self.norm = Norm(spec.v_head_dim, dtype)
        self.out_proj = Linear(spec.value_dim, hidden_size, False, dtype)
        join(self.in_proj_qkv, self.in_proj_z)
        join(self.in_proj_b, self.in_proj_a)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        s = current_step()
        ops, spec = s.ops, self.spec
        qkv, z = project(("in_proj_qkv", "in_proj_z"), x, self.in_proj_qkv, self.in_proj_z)  # [T, 2 Hk Dk + Hv Dv], [T, Hv Dv]
        z = z.unflatten(1, (-1, spec.v_head_dim))  # [T, Hv, Dv]
        b, a = project(("in_proj_b", "in_proj_a"), x, self.in_proj_b, self.in_proj_a)  # [T, Hv] each
        cache = s.state[self.layer]
        if cache is PACKED:
            conv_state = state = rows = state_ids = None
        else:
            state_ids = cache.state_ids if cache.state_ids is not None else s.batch.state_ids
            conv_state, state, rows = cache.conv, cache.state, cache.rows
        mixed = ops["conv1d"](qkv, self.conv1d.weight[:, 0], conv_state, state_ids, positions)
        q, k, v = mixed.split([spec.key_dim, spec.key_dim, spec.value_dim], dim=-1)
        out = ops["gdn_core"](q.unflatten(1, (-1, spec.k_head_dim)), k.unflatten(1, (-1, spec.k_head_dim)), v.unflatten(1, (-1, spec.v_head_dim)),
                              a, b, self.A_log, self.dt_bias, state, rows, state_ids, positions)  # [T, Hv, Dv]
        out = ops["gated_norm"](out, z, self.norm.weight, self.eps)
        return ops["out_proj"](out.flatten(1), self.out_proj.weight)  # [T, Hv Dv]: every token of the call, whatever x held
