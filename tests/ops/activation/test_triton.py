"""activation.triton, silu(gate) * up: float64 agreement of values and gradients, the reference's bits
(on a GPU only), and bitwise invariance to the batch and strides next to a gate rounded to bf16 once
batched. The tests that are the same for rope, residual and activation (the reference's signature,
refused constants, one launch, the battery) are in tests/ops/triton/test_elementwise_impls.py; how these
run without a GPU, and the shared helpers, in tests/ops/elementwise_triton.py.
"""

import pytest
import torch

from conftest import INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from isoexec.ops.activation import reference as activation_reference  # noqa: E402
from ops.elementwise_triton import ELEMENTWISE, activation, assert_two_inputs_rows_are_bitwise_invariant, within  # noqa: E402
from ops.triton_impls import assert_gradients_match_float64  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]


def silu_mul_float64(gate, up):
    gate = gate.double()
    return gate * torch.sigmoid(gate) * up.double()


@pytest.mark.parametrize("dtype,rel,abs", [(torch.float32, 2e-6, 1e-7), (torch.bfloat16, 2**-7, 1e-6)])
def test_activation_matches_float64(dtype, rel, abs):
    gate, up = randn(3, 5, 40, seed=21, scale=4.0, dtype=dtype), randn(3, 5, 40, seed=22, dtype=dtype)
    y = activation(boundary(ELEMENTWISE, dtype))(gate, up)
    assert y.shape == gate.shape and y.dtype == dtype
    assert within(y, silu_mul_float64(gate, up), rel, abs)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's exp is numpy's, not the reference's torch.exp")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_gives_the_references_bits(dtype):
    gate, up = randn(7, 40, seed=23, scale=4.0, dtype=dtype), randn(7, 40, seed=24, dtype=dtype)
    constants = boundary(ELEMENTWISE, dtype)
    assert bitwise_equal(activation(constants)(gate, up), activation_reference.silu_mul(gate, up, **constants))


def test_activation_gradients_match_float64():
    gate, up, g = randn(4, 24, seed=25, scale=4.0), randn(4, 24, seed=26), randn(4, 24, seed=27)
    assert_gradients_match_float64(activation(), silu_mul_float64, [gate, up], g, 1e-5)


def _activation_rows(dtype=torch.float32):
    gate = torch.cat([randn(17, 40, seed=28, scale=4.0), hazards(40)]).to(dtype)
    return gate, torch.cat([randn(17, 40, seed=29), hazards(40).flip(0)]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_rows_are_bitwise_invariant(dtype):
    assert_two_inputs_rows_are_bitwise_invariant(activation(boundary(ELEMENTWISE, dtype)), *_activation_rows(dtype))


def _activation_in_bf16_when_batched(gate, up):
    """Rounds the gate to bf16 once the batch is large enough."""
    return activation()(gate.bfloat16().float() if gate.shape[0] >= 8 else gate, up)


def test_activation_computed_in_bf16_when_batched_is_caught():
    assert batch_dependent(_activation_in_bf16_when_batched, list(_activation_rows())), "the invariance check missed a batch-dependent silu"
