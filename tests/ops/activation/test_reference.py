"""activation: correctness, gradients, batch invariance."""

import pytest
import torch

from conftest import batch_dependent
from controls import vector_tail_silu_mul
from isoexec.ops.activation import reference as act


def test_activation_matches_float64_and_a_vector_tail_variant_is_batch_dependent():
    """The control rounds the call's scalar tail differently (`controls.vector_tail_silu_mul`). (F.silu
    cannot serve: whether its vectorised body and tail round alike depends on the CPU's vector width.)"""
    g = torch.Generator().manual_seed(2)
    gate, up = torch.randn(40, 40, generator=g) * 4, torch.randn(40, 40, generator=g)
    ours = lambda a, b: act.silu_mul(a, b, input_dtype="float32", output_dtype="float32", compute_dtype="float32")  # noqa: E731
    exact = gate.double() * torch.sigmoid(gate.double()) * up.double()
    assert (ours(gate, up).double() - exact).abs().max() < 1e-5
    assert batch_dependent(ours, [gate, up]) == []
    control = lambda a, b: vector_tail_silu_mul(a, b, input_dtype="float32", output_dtype="float32", compute_dtype="float32")  # noqa: E731
    assert batch_dependent(control, [gate, up])


@pytest.mark.parametrize(
    "op,inputs",
    [
        (lambda a, b: act.silu_mul(a, b, input_dtype="float64", output_dtype="float64", compute_dtype="float64"),
         lambda g: (torch.randn(3, 6, dtype=torch.float64, generator=g, requires_grad=True), torch.randn(3, 6, dtype=torch.float64, generator=g, requires_grad=True))),
    ],
    ids=["activation"],
)
def test_gradients_match_float64_finite_differences(op, inputs):
    assert torch.autograd.gradcheck(op, inputs(torch.Generator().manual_seed(3)))
