"""Residual add in a declared compute dtype with one rounding to the output dtype."""

from torch import Tensor

from ..common import expect_dtype, torch_dtype


def add(x: Tensor, residual: Tensor, *, input_dtype: str, output_dtype: str, compute_dtype: str) -> Tensor:
    expect_dtype(x, input_dtype, "residual input")
    compute = torch_dtype(compute_dtype)
    return (x.to(compute) + residual.to(compute)).to(torch_dtype(output_dtype))
