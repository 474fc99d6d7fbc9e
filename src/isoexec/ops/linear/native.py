"""The ordinary fast path: the backend's GEMM (oneDNN/BLAS on CPU, cuBLAS on GPU)."""

import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, input_dtype: str, weight_dtype: str, output_dtype: str) -> Tensor:
    expect_dtype(x, input_dtype, "linear input")
    expect_dtype(weight, weight_dtype, "linear weight")
    y = F.linear(x, weight, bias)
    expect_dtype(y, output_dtype, "linear output")
    return y


def joined_linear(x: Tensor, weight: Tensor, bias: Tensor | None, widths: list[int], **constants) -> list[Tensor]:
    """One GEMM over sibling weights joined in memory, its columns split as views, as fast engines run
    q/k/v and gate/up; the backend picks its kernel by the joined N, so the bits may differ from one
    call per weight (native promises none)."""
    return list(linear(x, weight, bias, **constants).split(widths, dim=-1))
