"""Small helpers shared by the op families."""

import torch
from torch import Tensor

from ..contract.vocabulary import REQUIRED_CASES

# The cases an impl that runs anywhere claims.
ALL_CASES = frozenset(REQUIRED_CASES)

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Upper bound on the elements of one temporary product tile (64 MiB in fp32); tiling is over rows and
# output columns only, which never changes a row's arithmetic.
TILE_ELEMENTS = 1 << 24


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPES)})") from None


def expect_dtype(tensor: Tensor, name: str, what: str) -> None:
    if tensor.dtype != torch_dtype(name):
        raise ValueError(f"{what} must be {name} as the contract pins, got {str(tensor.dtype).removeprefix('torch.')}")

