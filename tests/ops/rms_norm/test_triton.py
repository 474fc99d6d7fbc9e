"""rms_norm.triton: correctness against float64, gradients, bitwise invariance to batch size, row
position and strides next to a deliberately batch-dependent variant, and admission through the battery.

Without a GPU the kernel runs in Triton's interpreter (see tests/ops/linear/test_triton.py for why
TRITON_INTERPRET is set before anything imports triton), so shapes are small and the battery probe is
a reduced version of the family's own. The fused rms_norm.residual Triton impl is tested in
tests/ops/rms_norm/test_residual.py; what the linear, rms_norm and logprobs Triton tests share is in
tests/ops/kernels_triton.py.
"""

import pytest
import torch

from conftest import INTERPRETER_WARNINGS, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from ops.kernels_triton import RMS_NORM, assert_the_battery_admits, rms_norm, strided  # noqa: E402
from ops.triton_impls import assert_gradients_match_float64  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]


# rms_norm


def _rms_norm_float64(x, w, eps, zero_centered):
    x, w = x.double(), w.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * ((1 + w) if zero_centered else w)


@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2**-7)])
def test_rms_norm_matches_float64(dtype, tol, zero_centered):
    x, w = randn(3, 5, 72, seed=12, dtype=dtype), randn(72, seed=13, dtype=dtype)
    y = rms_norm(boundary(RMS_NORM, dtype))(x, w, 1e-6, zero_centered)
    exact = _rms_norm_float64(x, w, 1e-6, zero_centered)
    assert y.shape == x.shape and y.dtype == dtype
    assert ((y.double() - exact).abs() / (exact.abs() + 1e-3)).max() < tol


@pytest.mark.parametrize("zero_centered", [False, True])
def test_rms_norm_gradients_match_float64(zero_centered):
    x, w, g = randn(4, 40, seed=14), randn(40, seed=15), randn(4, 40, seed=16)
    assert_gradients_match_float64(lambda x, w: rms_norm()(x, w, 1e-5, zero_centered),
                                   lambda x, w: _rms_norm_float64(x, w, 1e-5, zero_centered), [x, w], g, 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_rows_are_bitwise_invariant(dtype):
    x = torch.cat([randn(17, 40, seed=17), hazards(40)]).to(dtype)
    w = randn(40, seed=18, dtype=dtype)
    op = rms_norm(boundary(RMS_NORM, dtype))
    assert batch_dependent(op, [x], w) == []
    assert batch_dependent(lambda x, w: op(x, w, 1e-5, True), [x], w) == []
    assert bitwise_equal(op(strided(x), w), op(x, w))


def test_rms_norm_with_its_chunk_chosen_from_the_batch_is_caught():
    def chunk_from_rows(x, w):
        return rms_norm({**RMS_NORM, "reduce_block": 16 if x.shape[0] < 8 else 64})(x, w)

    # Another chunking sums the squares in another order, but a sum one ulp off rarely moves the rounded
    # 1/sqrt: wide rows (more roundings in each sum) and 34 rows in batches of 17 make some row's bits move.
    x, w = randn(34, 512, seed=19), randn(512, seed=20)
    assert batch_dependent(chunk_from_rows, [x], w, sizes=(17,)), "the invariance check missed a batch-dependent rms_norm"


# admission


@pytest.mark.parametrize("region", ["rms_norm"])
def test_the_battery_admits_the_triton_impl(region):
    assert_the_battery_admits(region)
