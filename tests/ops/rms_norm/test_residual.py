"""rms_norm.residual: (x, residual) -> (rms_norm(x + residual), x + residual) in one call.

Each fused impl must give, bit for bit, its family's residual add followed by its norm; rows must not
depend on the batch; gradients must match float64. Without a GPU the Triton kernel runs in Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET before anything imports triton),
which truncates fp32 -> bf16, so the Triton impl is compared with the Triton add and norm, not with the
reference.
"""

from types import SimpleNamespace

import pytest
import torch

from conftest import DEVICE, CountingKernel, INTERPRETER_WARNINGS, batch_dependent, bitwise_equal, fused_norms, preset_dict, triton_runs_here
from isoexec.contract import load_preset
from isoexec.ops.residual import reference as residual_reference
from isoexec.ops.rms_norm import native, reference
from isoexec.runtime import REGISTRY, Impl, Registry
from isoexec.validate.battery import hazard_rows, strided, validate_entry

needs_triton = pytest.mark.skipif(not triton_runs_here(), reason="no GPU, and Triton is missing or was imported before TRITON_INTERPRET=1 was set")
pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

REFERENCE = dict(accum_dtype="float32", reduce_block=16, block_tree="balanced_binary", tree="sequential")
TRITON = dict(accum_dtype="float32", reduce_block=32, num_warps=1)  # H = 48: two chunks, the last padded
HIDDEN = 48


def boundary(dtype: torch.dtype) -> dict:
    name = str(dtype).removeprefix("torch.")
    return dict(input_dtype=name, output_dtype=name)


def rows(dtype: torch.dtype, seed: int, count: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, residual [count + 12, HIDDEN] (random rows, then hazard rows meeting their negations and each
    other) and a weight [HIDDEN]."""
    g = torch.Generator().manual_seed(seed)
    hazards = hazard_rows(SimpleNamespace(dtype=dtype, device=DEVICE, generator=g), HIDDEN)
    randn = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(DEVICE)  # noqa: E731
    x = torch.cat([randn(count, HIDDEN), hazards, hazards])
    residual = torch.cat([randn(count, HIDDEN), hazards.neg(), hazards.flip(0)])
    return x, residual, randn(HIDDEN)


def fused_reference(dtype, **changes):
    return lambda x, r, w, eps=1e-6, zc=False: reference.rms_norm_residual(x, r, w, eps, zc, **boundary(dtype), **{**REFERENCE, **changes})


def composed_reference(dtype):
    """residual.reference's add, then rms_norm.reference: what the model ran before fusion."""

    def op(x, r, w, eps=1e-6, zc=False):
        s = residual_reference.add(x, r, **boundary(dtype), compute_dtype="float32")
        return reference.rms_norm(s, w, eps, zc, **boundary(dtype), **REFERENCE), s

    return op


def both(op):
    """The fused op's two outputs side by side, for the batch-invariance check."""
    return lambda *args: torch.cat(op(*args), -1)


def float64_norm(s, w, eps, zero_centered):
    s, w = s.double(), w.double()
    return s / torch.sqrt((s * s).mean(-1, keepdim=True) + eps) * ((1 + w) if zero_centered else w)


# reference and native


@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_gives_the_bits_of_the_add_then_the_norm(dtype, zero_centered):
    x, r, w = rows(dtype, seed=0)
    y, s = fused_reference(dtype)(x, r, w, 1e-6, zero_centered)
    expected_y, expected_s = composed_reference(dtype)(x, r, w, 1e-6, zero_centered)
    assert bitwise_equal(s, expected_s) and bitwise_equal(y, expected_y)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2**-8)])
def test_reference_matches_float64(dtype, tol):
    x, r, w = rows(dtype, seed=1, count=17)
    x, r = x[:17], r[:17]
    y, s = fused_reference(dtype)(x, r, w)
    exact_s = x.double() + r.double()
    assert ((s.double() - exact_s).abs() / (exact_s.abs() + 1e-3)).max() < tol
    exact_y = float64_norm(exact_s, w, 1e-6, False)
    assert ((y.double() - exact_y).abs() / (exact_y.abs() + 1e-3)).max() < 4 * tol


def test_reference_gradients_match_float64_finite_differences():
    g = torch.Generator().manual_seed(2)
    x, r = (torch.randn(4, 24, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    w = torch.randn(24, dtype=torch.float64, generator=g, requires_grad=True)
    op = lambda x, r, w: fused_reference(torch.float64, accum_dtype="float64")(x, r, w)  # noqa: E731
    assert torch.autograd.gradcheck(op, (x, r, w))


def test_without_a_residual_the_input_is_the_residual_stream():
    x, _, w = rows(torch.bfloat16, seed=3)
    bf16 = boundary(torch.bfloat16)
    for op, norm in [(fused_reference(torch.bfloat16), lambda x, w: reference.rms_norm(x, w, 1e-6, **bf16, **REFERENCE)),
                     (lambda x, r, w: native.rms_norm_residual(x, r, w, 1e-6, **bf16), lambda x, w: native.rms_norm(x, w, 1e-6, **bf16))]:
        y, s = op(x, None, w)
        assert s is x and bitwise_equal(y, norm(x, w))


def test_rows_are_batch_invariant_and_the_checks_can_fail():
    x, r, w = rows(torch.float32, seed=4, count=30)
    ours = fused_reference(torch.float32)
    assert batch_dependent(both(ours), [x, r], w) == []
    # The control: a fused op that switches its reduction with the batch. (Native RMSNorm cannot serve:
    # whether torch's CPU kernel reduces a row alike in every batch depends on the build and the CPU.)
    def mutant(x, r, w):
        return ours(x, r, w) if x.shape[0] <= 4 else fused_reference(torch.float32, block_tree="sequential")(x, r, w)

    assert batch_dependent(both(mutant), [x, r], w)


def test_the_battery_admits_the_reference_and_rejects_a_batch_dependent_mutant():
    contract = fused_norms(preset_dict("tiny-dense"), "rms_norm.residual.reference")
    entry = contract.entry("rms_norm.residual", "trainer_fwd")
    result = validate_entry(contract, entry, REGISTRY.probe("rms_norm.residual"), registry=REGISTRY, device=torch.device("cpu"))
    assert result.status == "admitted" and result.dtypes == ("bfloat16", "float32") and result.trials >= 100, result.failures[:3]

    def mutant(x, residual, weight, eps, zero_centered=False, **constants):
        tree = constants["block_tree"] if x.shape[0] <= 4 else "sequential"
        return reference.rms_norm_residual(x, residual, weight, eps, zero_centered, **{**constants, "block_tree": tree})

    registry = Registry()
    registry.register(Impl(id="rms_norm.residual.reference", version=1, region="rms_norm.residual", cases=frozenset(contract.cases),
                           fn=mutant))
    rejected = validate_entry(contract, entry, REGISTRY.probe("rms_norm.residual"), registry=registry, device=torch.device("cpu"))
    assert rejected.status == "rejected" and any("of a batch of" in f and "no residual" not in f for f in rejected.failures)


# triton


def triton_ops(dtype, **changes):
    """(fused rms_norm.residual.triton, residual.triton's add then rms_norm.triton) with one config."""
    from isoexec.ops.residual import triton as residual_triton
    from isoexec.ops.rms_norm import triton as rms_norm_triton

    constants = {**boundary(dtype), **TRITON, **changes}

    def fused(x, r, w, eps=1e-6, zc=False):
        return rms_norm_triton.rms_norm_residual(x, r, w, eps, zc, **constants)

    def composed(x, r, w, eps=1e-6, zc=False):
        s = residual_triton.add(x, r, **boundary(dtype), compute_dtype="float32")
        return rms_norm_triton.rms_norm(s, w, eps, zc, **constants), s

    return fused, composed


@needs_triton
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_gives_the_bits_of_the_triton_add_then_the_triton_norm(dtype, zero_centered):
    x, r, w = rows(dtype, seed=5)
    fused, composed = triton_ops(dtype)
    for args in [(x, r), (x.reshape(3, 7, HIDDEN), r.reshape(3, 7, HIDDEN)), (strided(x), r.t().contiguous().t())]:
        y, s = fused(*args, w, 1e-6, zero_centered)
        expected_y, expected_s = composed(*args, w, 1e-6, zero_centered)
        assert bitwise_equal(s, expected_s) and bitwise_equal(y, expected_y)
    wide = torch.cat([x, r], -1)  # non-contiguous halves of one buffer
    assert all(bitwise_equal(a, b) for a, b in zip(fused(wide[:, :HIDDEN], wide[:, HIDDEN:], w), composed(x, r, w)))


@needs_triton
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2**-7)])
def test_triton_matches_float64(dtype, tol):
    x, r, w = rows(dtype, seed=6, count=17)
    x, r = x[:17], r[:17]
    y, s = triton_ops(dtype)[0](x, r, w)
    exact_s = x.double() + r.double()
    assert ((s.double() - exact_s).abs() / (exact_s.abs() + 1e-3)).max() < tol
    exact_y = float64_norm(exact_s, w, 1e-6, False)
    assert ((y.double() - exact_y).abs() / (exact_y.abs() + 1e-3)).max() < 4 * tol


@needs_triton
@pytest.mark.parametrize("zero_centered", [False, True])
def test_triton_gradients_match_float64(zero_centered):
    x, r, w = rows(torch.float32, seed=7, count=5)
    x, r = x[:5], r[:5]
    g = torch.Generator().manual_seed(8)
    grad_y, grad_s = torch.randn(2, 5, HIDDEN, generator=g).to(DEVICE)
    params = [t.clone().requires_grad_() for t in (x, r, w)]
    y, s = triton_ops(torch.float32)[0](*params, 1e-5, zero_centered)
    ((y * grad_y).sum() + (s * grad_s).sum()).backward()
    exact = [t.double().requires_grad_() for t in (x, r, w)]
    exact_s = exact[0] + exact[1]
    ((float64_norm(exact_s, exact[2], 1e-5, zero_centered) * grad_y.double()).sum() + (exact_s * grad_s.double()).sum()).backward()
    for p, e in zip(params, exact):
        assert (p.grad.double() - e.grad).abs().max() < 1e-4 * (1 + e.grad.abs().max())


@needs_triton
def test_triton_without_a_residual_is_rms_norm_triton():
    from isoexec.ops.rms_norm import triton as rms_norm_triton

    x, _, w = rows(torch.bfloat16, seed=9)
    y, s = triton_ops(torch.bfloat16)[0](x, None, w)
    assert s is x and bitwise_equal(y, rms_norm_triton.rms_norm(x, w, 1e-6, **boundary(torch.bfloat16), **TRITON))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_rows_are_batch_invariant_and_a_batch_dependent_chunk_is_caught(dtype):
    x, r, w = rows(dtype, seed=10, count=5)
    fused, _ = triton_ops(dtype)
    assert batch_dependent(both(fused), [x, r], w, sizes=(2, 7, 17)) == []

    def chunk_from_rows(x, r, w):
        return triton_ops(torch.float32, reduce_block=16 if x.shape[0] < 8 else 64)[0](x, r, w)

    # fp32 (a bf16 output hides more), wide rows and batches of 17: a sum one ulp off rarely moves the rounded
    # 1/sqrt, so the control needs rows enough for some to show the other chunking.
    g = torch.Generator().manual_seed(10)
    x, r, w = (torch.randn(*shape, generator=g).to(DEVICE) for shape in ((34, 512), (34, 512), (512,)))
    assert batch_dependent(both(chunk_from_rows), [x, r], w, sizes=(17,))


@needs_triton
def test_a_fused_call_is_one_kernel_launch_and_stores_s_once(monkeypatch):
    from isoexec.ops.residual import triton as residual_triton
    from isoexec.ops.rms_norm import triton as rms_norm_triton

    norm, add = CountingKernel(rms_norm_triton.rms_norm_fwd_kernel), CountingKernel(residual_triton.residual_add_fwd_kernel)
    monkeypatch.setattr(rms_norm_triton, "rms_norm_fwd_kernel", norm)
    monkeypatch.setattr(residual_triton, "residual_add_fwd_kernel", add)
    x, r, w = rows(torch.bfloat16, seed=11, count=3)
    triton_ops(torch.bfloat16)[0](x.reshape(3, 5, HIDDEN), r.reshape(3, 5, HIDDEN), w)
    assert (norm.launches, add.launches) == (1, 0)


@needs_triton
def test_triton_registers_and_checks_its_constants():
    from isoexec.ops.rms_norm import tuning as rms_norm_tuning

    impl = REGISTRY.get("rms_norm.residual.triton", 1)
    assert impl.region == "rms_norm.residual" and impl.source_sha256
    constants = {**boundary(torch.bfloat16), **TRITON}
    for tiles in map(rms_norm_tuning.hopper_constants, (16, 64, 128, 768, 1024, 2048, 4096, 5120)):
        impl.check(constants | tiles)
    with pytest.raises(ValueError, match="rms_norm.residual.triton: reduce_block must be a power of two"):
        impl.check(constants | {"reduce_block": 48})
    with pytest.raises(ValueError, match="unsupported constants block_tree"):
        impl.check(constants | {"block_tree": "sequential"})
    with pytest.raises(ValueError, match="residual shape"):
        triton_ops(torch.float32)[0](torch.zeros(2, 8), torch.zeros(3, 8), torch.ones(8))


@needs_triton
def test_the_battery_admits_tiny_dense_tritons_fused_entry():
    """The preset's own entry and the registered probe: what `isoexec validate` runs."""
    contract = load_preset("tiny-dense-triton")
    entry = contract.entry("rms_norm.residual", "trainer_fwd")
    result = validate_entry(contract, entry, REGISTRY.probe("rms_norm.residual"), registry=REGISTRY, device=DEVICE)
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == ("bfloat16", "float32") and result.trials >= 100
