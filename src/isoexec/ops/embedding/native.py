"""The ordinary path: torch's embedding lookup."""

import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype


def embedding(ids: Tensor, weight: Tensor, *, output_dtype: str) -> Tensor:
    expect_dtype(weight, output_dtype, "embedding table")
    return F.embedding(ids, weight)
