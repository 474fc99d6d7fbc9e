"""`rms_norm.gated`: Gated DeltaNet's output norm, y = rms_norm(x) · w · silu(z) (`RMSNormGated` in
Qwen3-Next / Qwen3.5), per head of the core's output with the z projection as the gate.

`reference`: per row in the accumulation dtype, rms_norm.reference's reduction, times the weight, times
silu(z) written as z / (1 + exp(-z)) (torch's sigmoid and silu are not batch-invariant on CPU,
docs/experiments.md); one rounding. `native`: transformers' order, which rounds the normed row to the
input dtype before the weight and computes silu with F.silu.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype, torch_dtype
from .reference import rms_norm


def _check(x: Tensor, gate: Tensor, weight: Tensor, input_dtype: str) -> None:
    expect_dtype(x, input_dtype, "rms_norm.gated input")
    expect_dtype(gate, input_dtype, "rms_norm.gated gate")
    if gate.shape != x.shape or weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm.gated: x and gate must share a shape [..., H] and weight be [H], got {tuple(x.shape)}, "
                         f"{tuple(gate.shape)}, {tuple(weight.shape)}")


def reference(x: Tensor, gate: Tensor, weight: Tensor, eps: float, *, input_dtype: str, output_dtype: str, accum_dtype: str,
              reduce_block: int, block_tree: str, tree: str) -> Tensor:
    """x, gate [..., H], weight [H] -> [..., H]."""
    _check(x, gate, weight, input_dtype)
    accum = torch_dtype(accum_dtype)
    normed = rms_norm(x, weight, eps, input_dtype=input_dtype, output_dtype=accum_dtype, accum_dtype=accum_dtype, reduce_block=reduce_block,
                      block_tree=block_tree, tree=tree)
    z = gate.to(accum)
    return (normed * (z / (1.0 + torch.exp(-z)))).to(torch_dtype(output_dtype))


def native(x: Tensor, gate: Tensor, weight: Tensor, eps: float, *, input_dtype: str, output_dtype: str) -> Tensor:
    _check(x, gate, weight, input_dtype)
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.float())).to(torch_dtype(output_dtype))
