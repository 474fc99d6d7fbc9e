"""The `moe` feed-forward: router, routed experts, combine — three contract ops.

Parameters follow transformers 5's Qwen3-MoE layout: `gate.weight` [E, H], and the experts fused,
`experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I].

When the step carries a routing buffer (`Step.routing`), the layer copies its expert ids into its
column: a device copy, so a captured CUDA graph records them too.
"""

import torch
from torch import Tensor, nn

from ..context import current_step
from ..spec import MoESpec


class Router(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype))


class Experts(nn.Module):
    def __init__(self, spec: MoESpec, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        e, i = spec.num_experts, spec.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, hidden_size, dtype=dtype))
        self.down_proj = nn.Parameter(torch.empty(e, hidden_size, i, dtype=dtype))


class MoE(nn.Module):
    name = "mlp"

    def __init__(self, spec: MoESpec, layer: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.spec, self.layer = spec, layer
        self.gate = Router(spec.num_experts, hidden_size, dtype)
        self.experts = Experts(spec, hidden_size, dtype)

    def forward(self, x: Tensor) -> Tensor:
        current, spec = current_step(), self.spec
        ops = current.ops
        weights, ids = ops["router"](x, self.gate.weight, None, spec.top_k, spec.scoring, spec.norm_topk_prob)  # [T, k] each
        if current.routing is not None:
            current.routing[:, self.layer, : spec.top_k].copy_(ids)
        routed = ops["experts"](x, ids, self.experts.gate_up_proj, self.experts.down_proj)  # [T, k, H]
        return ops["combine"](routed, weights, ids)
