"""The ordinary path: a tensor add in the boundary dtype."""

from torch import Tensor

from ..common import expect_dtype


def add(x: Tensor, residual: Tensor, *, input_dtype: str, output_dtype: str) -> Tensor:
    expect_dtype(x, input_dtype, "residual input")
    y = x + residual
    expect_dtype(y, output_dtype, "residual output")
    return y
