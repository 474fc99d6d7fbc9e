"""linear and linear.row_parallel: correctness, gradients, batch invariance, and the leaf tree."""

import pytest
import torch

from conftest import bitwise_equal
from controls import SMALL, split_k_linear
from isoexec.contract import load_preset
from isoexec.model import PRESETS
from isoexec.ops.linear import reference
from isoexec.ops.linear.reference import combine_leaves, leaf_partials
from isoexec.runtime.registry import REGISTRY, Impl, Registry
from isoexec.validate.battery import validate_entry

C32 = dict(input_dtype="float32", weight_dtype="float32", output_dtype="float32", accum_dtype="float32", block_k=16, block_tree="balanced_binary", tree="sequential")
LEAVES = dict(num_leaves=8, leaf_tree="balanced_binary")


def _bf16(c):
    return {**c, "input_dtype": "bfloat16", "weight_dtype": "bfloat16", "output_dtype": "bfloat16"}


@pytest.mark.parametrize("op,extra", [(reference.linear, {}), (reference.row_parallel_linear, LEAVES)])
@pytest.mark.parametrize("k", [64, 96, 40])
def test_matches_float64(op, extra, k):
    if extra and k % extra["num_leaves"]:
        pytest.skip("K must split into whole leaves")
    g = torch.Generator().manual_seed(k)
    x, w, b = torch.randn(33, k, generator=g), torch.randn(20, k, generator=g), torch.randn(20, generator=g)
    exact = x.double() @ w.double().T + b.double()
    assert (op(x, w, b, **C32, **extra).double() - exact).abs().max() < 1e-5
    bf = op(x.bfloat16(), w.bfloat16(), b.bfloat16(), **_bf16(C32), **extra)
    exact_bf = x.bfloat16().double() @ w.bfloat16().double().T + b.bfloat16().double()
    assert ((bf.double() - exact_bf).abs() / (exact_bf.abs() + 1)).max() < 2**-7


def test_gradients_match_float64_finite_differences():
    c64 = {**C32, "input_dtype": "float64", "weight_dtype": "float64", "output_dtype": "float64", "accum_dtype": "float64"}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 16, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(5, 16, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: reference.linear(x, w, b, **c64), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: reference.row_parallel_linear(x, w, **c64, **LEAVES), (x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_alone_equals_the_row_in_any_batch_and_a_split_k_variant_does_not(dtype):
    """The control is a split-K variant (`controls.split_k_linear`), batch-dependent by construction;
    native linear cannot serve: whether this CPU's GEMM gives a row other bits in a batch depends on the
    BLAS build and the CPU model."""
    c = C32 if dtype == torch.float32 else _bf16(C32)
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(64, 64, generator=g), torch.randn(24, 64, generator=g) * 64**-0.5
    x[5] *= torch.finfo(torch.bfloat16).tiny / 4  # subnormal outputs
    x, w = x.to(dtype), w.to(dtype)
    sizes = (2, 7, 16, 33, 64)

    def batch_dependent(op):
        alone = torch.cat([op(x[i : i + 1], w) for i in range(64)])
        return [(m, start) for m in sizes for start in (0, 64 - m) if not bitwise_equal(op(x[start : start + m], w), alone[start : start + m])]

    assert batch_dependent(lambda x, w: reference.linear(x, w, **c)) == []
    # every batch past the control's small-call size takes the other order than a row alone
    assert batch_dependent(lambda x, w: split_k_linear(x, w, **c)) == [(m, start) for m in sizes for start in (0, 64 - m) if m > SMALL]


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_leaf_tree_gives_the_same_bits_at_every_tp_size(tp):
    """A rank at TP = tp owns a contiguous run of leaves; gathering the partials and evaluating the
    same tree reproduces TP = 1 bit for bit."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(9, 256, generator=g).bfloat16(), torch.randn(12, 256, generator=g).bfloat16()
    whole = reference.row_parallel_linear(x, w, **_bf16(C32), **LEAVES)
    shard = 256 // tp
    partials = [
        leaf_partials(x[:, r * shard : (r + 1) * shard], w[:, r * shard : (r + 1) * shard], num_leaves=8 // tp, block_k=16,
                      block_tree="balanced_binary", tree="sequential", accum=torch.float32)
        for r in range(tp)
    ]
    gathered = combine_leaves(torch.cat(partials, dim=-1), "balanced_binary").bfloat16()
    assert bitwise_equal(gathered, whole)


def test_inputs_in_the_wrong_dtype_or_shape_are_refused():
    with pytest.raises(ValueError, match="linear input must be bfloat16 as the contract pins, got float32"):
        reference.linear(torch.randn(2, 16), torch.randn(3, 16).bfloat16(), **_bf16(C32))
    with pytest.raises(ValueError, match="input has K = 16, weight has K = 32"):
        reference.linear(torch.randn(2, 16), torch.randn(3, 32), **C32)
    with pytest.raises(ValueError, match="K = 20 is not the width of leaves 4..7 of K = 150 in 8 leaves"):
        leaf_partials(torch.randn(2, 20), torch.randn(3, 20), num_leaves=8, block_k=16, block_tree="balanced_binary", tree="sequential",
                      accum=torch.float32, global_k=150, leaves=range(4, 8))


def test_rows_beyond_the_slice_never_leak():
    buffer = torch.full((10, 32), float("nan"))
    buffer[:4] = torch.randn(4, 32)
    w = torch.randn(8, 32)
    assert torch.isfinite(reference.linear(buffer[:4], w, **C32)).all()


def test_a_contract_fitted_to_a_model_is_probed_at_its_projection_widths():
    """An impl whose decode rows go wrong only where K is wide (as a row-parallel kernel whose decode
    tile runs one K block per leaf did on an H200) passes the probe's own K = 64 and fails when the probe
    also takes the fitted model's K values (`validate(..., spec=...)` passes them as `geometry`)."""
    honest = REGISTRY.get("linear.row_parallel.reference", 1)

    def wide_k_drifts_in_small_batches(x, weight, bias=None, **constants):
        out = honest.fn(x, weight, bias, **constants)
        if x.shape[-1] >= 1024 and 0 < x.reshape(-1, x.shape[-1]).shape[0] <= 8:  # a decode-sized batch
            out = (out.view(torch.int16) ^ 1).view(out.dtype) if out.dtype == torch.bfloat16 else torch.nextafter(out, torch.full_like(out, float("inf")))
        return out

    registry = Registry()
    registry.register(Impl(id="linear.row_parallel.reference", version=1, region="linear.row_parallel", cases=honest.cases,
                           fn=wide_k_drifts_in_small_batches))
    registry.register_probe("linear.row_parallel", REGISTRY.probe("linear.row_parallel"))
    dense = load_preset("tiny-dense")
    entry = dense.entry("linear.row_parallel", "trainer_fwd")
    spec = PRESETS["qwen3-0.6b-random"]
    small = validate_entry(dense, entry, registry.probe("linear.row_parallel"), registry=registry, device=torch.device("cpu"))
    assert small.status == "admitted", small.failures[:3]
    geometry = {"linear_k": sorted({k for shapes in spec.projections.values() for _, k in shapes})}
    fitted = validate_entry(dense, entry, registry.probe("linear.row_parallel"), registry=registry, device=torch.device("cpu"), geometry=geometry)
    assert fitted.status == "rejected" and any("K = " in failure for failure in fitted.failures)
