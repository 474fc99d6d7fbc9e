"""The `moe` feed-forward: router, routed experts, combine — three contract ops.

Parameters follow transformers 5's layout: `gate.weight` [E, H], and the experts fused,
`experts.gate_up_proj` [E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I]. DeepSeek-V3 / GLM
add `gate.e_score_correction_bias` [E], kept in float32 as their checkpoints store it, and
`shared_experts` (an `mlp` of the shared width, run by the dense ops; the combine adds its output);
Qwen3-Next / Qwen3.5-MoE one `shared_expert`, which the combine scales by sigmoid(`shared_expert_gate`(x)).

When the step carries a routing buffer (`Step.routing`), the layer copies its expert ids into its
column: a device copy, so a captured CUDA graph records them too.
"""

import torch
from torch import Tensor, nn

from ..context import current_step
from ..spec import MLPSpec, MoESpec
from .mlp import MLP
from .params import Linear


class Router(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, score_bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype))
        # Selection only (no gradient reaches it); DeepSeek updates it outside the loss, we never do.
        bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32), requires_grad=False) if score_bias else None
        self.e_score_correction_bias = bias


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
        self.gate = Router(spec.num_experts, hidden_size, spec.score_bias, dtype)
        self.experts = Experts(spec, hidden_size, dtype)
        shared = MLP(MLPSpec(intermediate_size=spec.shared_intermediate_size), layer, hidden_size, dtype) if spec.shared_intermediate_size else None
        if spec.shared_gate:  # Qwen3-Next / Qwen3.5-MoE's names
            self.shared_expert = shared
            self.shared_expert_gate = Linear(hidden_size, 1, False, dtype)
        elif shared is not None:
            self.shared_experts = shared

    def forward(self, x: Tensor) -> Tensor:
        current, spec = current_step(), self.spec
        ops = current.ops
        weights, ids = ops["router"](x, self.gate.weight, self.gate.e_score_correction_bias, spec.top_k, spec.scoring,
                                     spec.norm_topk_prob, spec.n_group, spec.topk_group, spec.routed_scaling_factor)  # [T, k] each
        if current.routing is not None:
            current.routing[:, self.layer, : spec.top_k].copy_(ids)
        routed = ops["experts"](x, ids, self.experts.gate_up_proj, self.experts.down_proj)  # [T, k, H]
        shared = gate = None
        if spec.shared_gate:  # the combine scales the shared output by sigmoid(gate) in fp32
            shared, gate = self.shared_expert(x), ops["shared_expert_gate"](x, self.shared_expert_gate.weight)  # [T, H], [T, 1]
        elif spec.shared_intermediate_size:
            shared = self.shared_experts(x)
        return ops["combine"](routed, weights, ids, shared, gate)
