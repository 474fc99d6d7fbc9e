"""The `mlp` feed-forward: down(silu(gate(x)) * up(x)), the activation one contract op."""

import torch
from torch import Tensor, nn

from ..context import current_step
from ..spec import MLPSpec
from .params import Linear, join, project


class MLP(nn.Module):
    name = "mlp"
    SIBLINGS = (("gate_proj", "up_proj"),)

    def __init__(self, spec: MLPSpec, layer: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.gate_proj = Linear(hidden_size, spec.intermediate_size, False, dtype)
        self.up_proj = Linear(hidden_size, spec.intermediate_size, False, dtype)
        self.down_proj = Linear(spec.intermediate_size, hidden_size, False, dtype)
        join(self.gate_proj, self.up_proj)

    def forward(self, x: Tensor) -> Tensor:
        ops = current_step().ops
        gate, up = project(("gate_proj", "up_proj"), x, self.gate_proj, self.up_proj)
        return ops["down_proj"](ops["silu_mul"](gate, up), self.down_proj.weight)
