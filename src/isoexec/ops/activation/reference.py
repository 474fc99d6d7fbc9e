"""SwiGLU activation silu(gate) * up, elementwise in the compute dtype with one rounding.

silu is written as g / (1 + exp(-g)) from exp, add and divide: measured on this project's CPU,
torch.exp is bitwise the same for an element whatever the tensor's size, while torch.sigmoid and
F.silu are not (their vectorised body and scalar tail round differently; see docs/experiments.md).
"""

from torch import Tensor

from ..common import expect_dtype, torch_dtype


def silu_mul(gate: Tensor, up: Tensor, *, input_dtype: str, output_dtype: str, compute_dtype: str) -> Tensor:
    """gate, up [..., I] -> [..., I]."""
    expect_dtype(gate, input_dtype, "activation gate")
    compute = torch_dtype(compute_dtype)
    g = gate.to(compute)
    return (g / (1.0 + (-g).exp()) * up.to(compute)).to(torch_dtype(output_dtype))
