"""residual.triton, x + residual: float64 agreement, the reference's bits (bf16 on a GPU only), gradients
that are the incoming one, and bitwise invariance to the batch and strides next to inputs rounded to
bf16 once batched. The tests that are the same for rope, residual and activation are in
tests/ops/triton/test_elementwise_impls.py; how these run without a GPU, and the shared helpers, in
tests/ops/elementwise_triton.py.
"""

import pytest
import torch

from conftest import INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from isoexec.ops.residual import reference as residual_reference  # noqa: E402
from ops.elementwise_triton import ELEMENTWISE, assert_two_inputs_rows_are_bitwise_invariant, residual, within  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]


@pytest.mark.parametrize("dtype,rel", [(torch.float32, 2**-23), (torch.bfloat16, 2**-7)])
def test_residual_matches_float64(dtype, rel):
    x, r = randn(3, 5, 40, seed=12, dtype=dtype), randn(3, 5, 40, seed=13, dtype=dtype)
    y = residual(boundary(ELEMENTWISE, dtype))(x, r)
    assert y.shape == x.shape and y.dtype == dtype
    assert within(y, x.double() + r.double(), rel, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not ON_GPU, reason="the interpreter truncates fp32 -> bf16, the reference rounds to nearest"))])
def test_residual_gives_the_references_bits(dtype):
    x, r = randn(7, 40, seed=14, dtype=dtype), randn(7, 40, seed=15, dtype=dtype)
    constants = boundary(ELEMENTWISE, dtype)
    assert bitwise_equal(residual(constants)(x, r), residual_reference.add(x, r, **constants))


def test_residual_gradients_match_float64():
    x, r, g = randn(4, 24, seed=16), randn(4, 24, seed=17), randn(4, 24, seed=18)
    params = [t.clone().requires_grad_() for t in (x, r)]
    residual()(*params).backward(g)
    assert all(bitwise_equal(p.grad, g) for p in params)


def _residual_rows(dtype=torch.float32):
    x = torch.cat([randn(17, 40, seed=19), hazards(40)]).to(dtype)
    return x, torch.cat([randn(17, 40, seed=20), hazards(40).neg()]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_rows_are_bitwise_invariant(dtype):
    assert_two_inputs_rows_are_bitwise_invariant(residual(boundary(ELEMENTWISE, dtype)), *_residual_rows(dtype))


def _residual_in_bf16_when_batched(x, r):
    """Rounds its inputs to bf16 once the batch is large enough."""
    if x.shape[0] >= 8:
        x, r = x.bfloat16().float(), r.bfloat16().float()
    return residual()(x, r)


def test_residual_computed_in_bf16_when_batched_is_caught():
    assert batch_dependent(_residual_in_bf16_when_batched, list(_residual_rows())), "the invariance check missed a batch-dependent add"
