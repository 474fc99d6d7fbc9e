"""Token embedding as an exact gather: each output row is a bit copy of a table row."""

from torch import Tensor

from ..common import expect_dtype


def embedding(ids: Tensor, weight: Tensor, *, output_dtype: str) -> Tensor:
    """ids [...] int64, weight [V, H] -> [..., H]."""
    expect_dtype(weight, output_dtype, "embedding table")
    return weight.index_select(0, ids.reshape(-1)).reshape(*ids.shape, weight.shape[-1])
