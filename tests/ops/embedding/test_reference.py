"""embedding: correctness, gradients."""

import pytest
import torch

from conftest import bitwise_equal
from isoexec.ops.embedding import reference as emb


def test_embedding_is_an_exact_gather():
    w = torch.randn(10, 6).bfloat16()
    ids = torch.tensor([[3, 0], [9, 3]])
    out = emb.embedding(ids, w, output_dtype="bfloat16")
    assert out.shape == (2, 2, 6) and bitwise_equal(out[1, 1], w[3]) and bitwise_equal(out[0, 0], w[3])


@pytest.mark.parametrize(
    "op,inputs",
    [
        (lambda ids, w: emb.embedding(ids, w, output_dtype="float64"),
         lambda g: (torch.tensor([1, 1, 3]), torch.randn(4, 5, dtype=torch.float64, generator=g, requires_grad=True))),
    ],
    ids=["embedding"],
)
def test_gradients_match_float64_finite_differences(op, inputs):
    assert torch.autograd.gradcheck(op, inputs(torch.Generator().manual_seed(3)))
