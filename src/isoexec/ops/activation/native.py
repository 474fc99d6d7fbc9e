"""The ordinary path: F.silu(gate) * up in the boundary dtype, as Hugging Face models compute it."""

import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype


def silu_mul(gate: Tensor, up: Tensor, *, input_dtype: str, output_dtype: str) -> Tensor:
    expect_dtype(gate, input_dtype, "activation gate")
    y = F.silu(gate) * up
    expect_dtype(y, output_dtype, "activation output")
    return y
