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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_tables_gradient_is_the_same_bits_run_to_run(device):
    """Rows read by many positions sum their gradients in position order, not in the order a GPU's atomics land
    (index_select's own backward): repeated backward passes give the same bits, and the sum, in float32 rounded once,
    is within a bfloat16 rounding of the exact one."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8, (4096,), generator=g).to(device)  # every row read ~500 times
    upstream = torch.randn(4096, 64, generator=g).bfloat16().to(device)
    weight = torch.randn(40, 64, generator=g).bfloat16().to(device).requires_grad_()

    def grad():
        weight.grad = None
        emb.embedding(ids, weight, output_dtype="bfloat16").backward(upstream)
        return weight.grad.clone()

    first = grad()
    assert all(bitwise_equal(first, grad()) for _ in range(5))
    exact = torch.zeros(40, 64, dtype=torch.float64, device=device).index_add_(0, ids, upstream.double())
    assert ((first.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all() and not first[8:].any()
