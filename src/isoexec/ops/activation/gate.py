"""`activation.gate`: x · sigmoid(g), the output gate of Qwen3-Next / Qwen3.5's full attention. `reference` writes sigmoid from exp, add and divide in the compute dtype
with one rounding (torch.sigmoid is not batch-invariant on CPU, docs/experiments.md); `native` is
transformers' `x * torch.sigmoid(g)` in the input dtype."""

import torch
from torch import Tensor

from ..common import expect_dtype, torch_dtype


def _check(x: Tensor, gate: Tensor, input_dtype: str) -> None:
    expect_dtype(x, input_dtype, "activation.gate input")
    expect_dtype(gate, input_dtype, "activation.gate gate")
    if gate.shape != x.shape:
        raise ValueError(f"activation.gate: x and gate must share a shape, got {tuple(x.shape)} and {tuple(gate.shape)}")


def reference(x: Tensor, gate: Tensor, *, input_dtype: str, output_dtype: str, compute_dtype: str) -> Tensor:
    """x, gate [..., N] -> [..., N]."""
    _check(x, gate, input_dtype)
    compute = torch_dtype(compute_dtype)
    return (x.to(compute) * (1.0 / (1.0 + torch.exp(-gate.to(compute))))).to(torch_dtype(output_dtype))


def native(x: Tensor, gate: Tensor, *, input_dtype: str, output_dtype: str) -> Tensor:
    _check(x, gate, input_dtype)
    return (x * torch.sigmoid(gate)).to(torch_dtype(output_dtype))
