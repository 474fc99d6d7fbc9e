"""The ordinary fast path: torch's fp32 log_softmax over the vocabulary."""

import torch
from torch import Tensor

from ..common import expect_dtype, torch_dtype


def logprobs(logits: Tensor, *, input_dtype: str, output_dtype: str) -> Tensor:
    """logits [..., V] -> [..., V]."""
    expect_dtype(logits, input_dtype, "logprobs input")
    return torch.log_softmax(logits.float(), -1).to(torch_dtype(output_dtype))
