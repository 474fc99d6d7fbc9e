"""The elementwise Triton impls (rope, residual, activation) together, each test the same for the three:
the contract's view (each impl takes exactly its reference's arguments, registers and accepts the
presets' constants, refuses bad constants, bad shapes and CPU tensors without the interpreter, and runs
in one launch per call), importing and registering nothing without triton, admission through the
battery next to a batch-dependent variant's rejection, and capture in CUDA graphs. Each family's own
Triton tests are in tests/ops/{rope,residual,activation}/test_triton.py; how these run without a GPU,
and what they share, is in tests/ops/elementwise_triton.py.
"""

import inspect

import pytest
import torch

from conftest import INTERPRETER_WARNINGS, ON_GPU, CountingKernel, bitwise_equal, boundary, randn, require_triton

require_triton()

from isoexec.contract import load_preset  # noqa: E402
from isoexec.ops import triton_support  # noqa: E402
from isoexec.ops.rope import triton as rope_triton  # noqa: E402
from isoexec.runtime.registry import Impl, Registry  # noqa: E402
from ops.elementwise_triton import BATTERY, ELEMENTWISE, FAMILIES, ROPE, _battery, _registry, activation, positions, residual, rope  # noqa: E402
from ops.triton_impls import assert_admitted, assert_import_and_register_nothing_without_triton  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]


# the contract's view: the reference's arguments and constants, and one launch


@pytest.mark.parametrize("region", list(FAMILIES))
def test_the_triton_impl_takes_exactly_the_references_arguments(region):
    _, fn, reference_fn, _ = FAMILIES[region]
    params = lambda f: [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]  # noqa: E731
    assert params(fn) == params(reference_fn)


def test_the_three_impls_register_and_accept_the_presets_constants():
    registry = _registry()
    assert {impl.ref for impl in registry} == {"rope.triton@1", "residual.triton@1", "activation.triton@1"}
    assert all(impl.source_sha256 for impl in registry)
    contract = load_preset("tiny-dense-triton")
    for region in ("rope", "activation"):
        registry.get(f"{region}.triton", 1).check(contract.entry(region, "engine_decode").constants)
    # tiny-dense-triton fuses the residual add into rms_norm.residual; the plain add takes the activation's constants.
    registry.get("residual.triton", 1).check(contract.entry("activation", "engine_decode").constants)


@pytest.mark.parametrize("region,change,message", [
    ("rope", {"table_build": "device_float32"}, 'table_build must be "cpu_float64"'),
    ("rope", {"compute_dtype": "float64"}, "computes in float32 only"),
    ("rope", {"table_dtype": "float8"}, "unknown dtype 'float8'"),
    ("rope", {"block_h": 16}, "unsupported constants block_h"),
    ("residual", {"compute_dtype": "bfloat16"}, "computes in float32 only"),
    ("residual", {"output_dtype": "float64"}, "output_dtype must be one of bfloat16, float16, float32"),
    ("activation", {"compute_dtype": "float64"}, "computes in float32 only"),
    ("activation", {"input_dtype": "float64"}, "input_dtype must be one of"),
])
def test_bad_constants_are_refused(region, change, message):
    impl = _registry().get(f"{region}.triton", 1)
    with pytest.raises(ValueError, match=message):
        impl.check(FAMILIES[region][3] | change)
    with pytest.raises(ValueError, match="missing constants compute_dtype"):
        impl.check({k: v for k, v in FAMILIES[region][3].items() if k != "compute_dtype"})


def test_bad_shapes_are_refused():
    x, pos = randn(3, 2, 16, seed=0), positions(3, seed=0)
    for call, message in [(lambda: rope(rotary_dim=7)(x, pos), "rotary_dim must be even"),
                          (lambda: rope(rotary_dim=0)(x, pos), r"rotary_dim 0 must be in 1\.\.16"),
                          (lambda: rope()(x.reshape(3, 32), pos), r"x must be \[T, H, D\]"),
                          (lambda: rope()(x, pos[:2]), "2 positions for 3 tokens"),
                          (lambda: residual()(x, x[:2]), "residual shape"),
                          (lambda: activation()(x, x[..., :8]), "up shape")]:
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.parametrize("region,kernel_name,call", [
    ("rope", "rope_fwd_kernel", lambda: rope(rotary_dim=12)(randn(20, 3, 16, seed=1), positions(20, seed=1))),
    ("residual", "residual_add_fwd_kernel", lambda: residual()(randn(2, 3, 2100, seed=2), randn(2, 3, 2100, seed=3))),
    ("activation", "silu_mul_fwd_kernel", lambda: activation()(randn(2, 3, 2100, seed=4), randn(2, 3, 2100, seed=5))),
])
def test_a_call_is_one_kernel_launch(monkeypatch, region, kernel_name, call):
    """Many tokens, several heads, a width of three column tiles, partial rotary: still one launch."""
    counter = CountingKernel(getattr(FAMILIES[region][0], kernel_name))
    monkeypatch.setattr(FAMILIES[region][0], kernel_name, counter)
    call()
    assert counter.launches == 1


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(triton_support, "interpreting", lambda: False)
    x = torch.randn(2, 2, 8)
    for call, name in [(lambda: rope()(x, torch.zeros(2, dtype=torch.long)), "rope"), (lambda: residual()(x, x), "residual"),
                       (lambda: activation()(x, x), "activation")]:
        with pytest.raises(RuntimeError, match=f"{name}.triton needs a CUDA device or TRITON_INTERPRET=1"):
            call()


def test_without_triton_the_modules_import_and_register_nothing():
    assert_import_and_register_nothing_without_triton("isoexec.ops.rope.triton", "isoexec.ops.residual.triton", "isoexec.ops.activation.triton")


# admission


@pytest.mark.parametrize("region", list(BATTERY))
def test_the_battery_admits_the_triton_impl(region):
    """With the family's own probe, in the interpreter too (a few seconds each)."""
    assert_admitted(_battery(region, _registry(), BATTERY[region][0]), min_trials=300)


@pytest.mark.parametrize("region", list(BATTERY))
def test_the_battery_rejects_a_batch_dependent_variant(region):
    """The same kernel, with its inputs or table rounded to bf16 once the batch is large enough; a
    reduced probe under the interpreter."""
    full_probe, small_probe, variant = BATTERY[region]
    registry = Registry()
    registry.register(Impl(id=f"{region}.triton", version=1, region=region, cases=rope_triton.ALL_CASES, fn=variant))
    assert _battery(region, registry, full_probe if ON_GPU else small_probe).status == "rejected"


# CUDA graphs


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_each_op_is_captured_in_a_cuda_graph_and_replays_new_inputs():
    """Free of host syncs (a sync fails the capture); the rope table is built by the eager warm-up."""
    dtype, constants = torch.bfloat16, boundary(ELEMENTWISE, torch.bfloat16)
    x, pos, other = randn(9, 4, 64, seed=30, dtype=dtype), positions(9, seed=30), randn(9, 4, 64, seed=31, dtype=dtype)
    for op, args in [(rope(boundary(ROPE, dtype), rotary_dim=32), (x, pos)), (residual(constants), (x, other)),
                     (activation(constants), (x, other))]:
        op(*args)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = op(*args)
        x_before = x.clone()
        x.copy_(randn(9, 4, 64, seed=32, dtype=dtype))
        graph.replay()
        assert bitwise_equal(captured, op(*args))
        x.copy_(x_before)
