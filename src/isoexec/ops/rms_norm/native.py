"""The ordinary path: torch's fused RMSNorm, after a plain tensor add where there is a residual."""

import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype


def rms_norm(x: Tensor, weight: Tensor, eps: float, zero_centered: bool = False, *, input_dtype: str, output_dtype: str) -> Tensor:
    expect_dtype(x, input_dtype, "rms_norm input")
    y = F.rms_norm(x, (x.shape[-1],), 1.0 + weight if zero_centered else weight, eps)
    expect_dtype(y, output_dtype, "rms_norm output")
    return y


def rms_norm_residual(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, zero_centered: bool = False, *,
                      input_dtype: str, output_dtype: str) -> tuple[Tensor, Tensor]:
    s = x if residual is None else x + residual
    return rms_norm(s, weight, eps, zero_centered, input_dtype=input_dtype, output_dtype=output_dtype), s
