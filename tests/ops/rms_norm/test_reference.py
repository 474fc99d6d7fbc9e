"""rms_norm: correctness against float64, gradients, batch invariance."""

import pytest
import torch

from conftest import batch_dependent
from isoexec.ops.rms_norm import reference

C = dict(accum_dtype="float32", reduce_block=16, block_tree="balanced_binary", tree="sequential")


def _ref(dtype):
    name = str(dtype).removeprefix("torch.")
    return lambda x, w, eps=1e-6, zc=False: reference.rms_norm(x, w, eps, zc, input_dtype=name, output_dtype=name, **C)


@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2**-8)])
def test_matches_float64(dtype, tol, zero_centered):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(17, 72, generator=g).to(dtype), torch.randn(72, generator=g).to(dtype)
    xd, wd = x.double(), w.double()
    exact = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-6) * ((1 + wd) if zero_centered else wd)
    got = _ref(dtype)(x, w, 1e-6, zero_centered).double()
    assert ((got - exact).abs() / (exact.abs() + 1e-3)).max() < tol


def test_gradients_match_float64_finite_differences():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 24, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(24, dtype=torch.float64, generator=g, requires_grad=True)
    op = lambda x, w: reference.rms_norm(x, w, 1e-6, input_dtype="float64", output_dtype="float64", **{**C, "accum_dtype": "float64"})  # noqa: E731
    assert torch.autograd.gradcheck(op, (x, w))


def test_batch_invariant_and_a_batch_dependent_mutant_is_caught():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(40, 96, generator=g), torch.randn(96, generator=g)
    ours = _ref(torch.float32)
    assert batch_dependent(ours, [x], w) == []
    # The control: a mutant that switches its reduction with the batch size. (Native RMSNorm cannot serve:
    # whether torch's CPU kernel reduces a row alike in every batch depends on the build and the CPU.)

    def mutant(x, w):
        if x.shape[0] > 4:
            return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) / x.shape[-1] + 1e-6) * w
        return ours(x, w)

    assert batch_dependent(mutant, [x], w)


def test_input_dtype_is_checked():
    with pytest.raises(ValueError, match="rms_norm input must be bfloat16"):
        reference.rms_norm(torch.randn(2, 8), torch.randn(8), 1e-6, input_dtype="bfloat16", output_dtype="bfloat16", **C)
