"""The elementwise Triton kernels (rope, residual, activation): the reference's signature and constants,
one launch per call, correctness against float64, gradients, bitwise invariance to the batch next to
deliberately batch-dependent variants, and admission through the battery.

Without a GPU the kernels run in Triton's interpreter (see tests/ops/test_triton_kernels.py for why
TRITON_INTERPRET is set before anything imports triton), so shapes are small; the battery admits each
impl with its family's own probe and shows a batch-dependent variant rejected with a reduced one. The
interpreter truncates fp32 -> bf16 where the GPU and torch round to nearest, so bf16 results equal the
reference's bits only on a GPU.
"""

import dataclasses
import inspect
import subprocess
import sys

import pytest
import torch

from conftest import DEVICE, CountingKernel, INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from isoexec.contract import load_preset  # noqa: E402
from isoexec.contract.schema import ImplRef  # noqa: E402
from isoexec.ops import triton_support  # noqa: E402
from isoexec.ops.activation import probe as activation_probe  # noqa: E402
from isoexec.ops.activation import reference as activation_reference  # noqa: E402
from isoexec.ops.activation import triton as activation_triton  # noqa: E402
from isoexec.ops.residual import probe as residual_probe  # noqa: E402
from isoexec.ops.residual import reference as residual_reference  # noqa: E402
from isoexec.ops.residual import triton as residual_triton  # noqa: E402
from isoexec.ops.rope import probe as rope_probe  # noqa: E402
from isoexec.ops.rope import reference as rope_reference  # noqa: E402
from isoexec.ops.rope import triton as rope_triton  # noqa: E402
from isoexec.runtime.registry import Impl, Registry  # noqa: E402
from isoexec.validate.battery import hazard_rows, rowwise, strided, validate_entry  # noqa: E402

pytestmark = INTERPRETER_WARNINGS

MAX_POSITIONS = 4096

ROPE = dict(input_dtype="float32", output_dtype="float32", table_dtype="float32", compute_dtype="float32", table_build="cpu_float64")
ELEMENTWISE = dict(input_dtype="float32", output_dtype="float32", compute_dtype="float32")
FAMILIES = {  # region: (triton module, its fn, the reference's fn, float32 constants)
    "rope": (rope_triton, rope_triton.rope, rope_reference.rope, ROPE),
    "residual": (residual_triton, residual_triton.add, residual_reference.add, ELEMENTWISE),
    "activation": (activation_triton, activation_triton.silu_mul, activation_reference.silu_mul, ELEMENTWISE),
}


def positions(count: int, seed: int) -> torch.Tensor:
    """Random positions with the table's first and last rows among them."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randint(0, MAX_POSITIONS, (count - 2,), generator=g), torch.tensor([0, MAX_POSITIONS - 1])]).to(DEVICE)


def within(y: torch.Tensor, exact: torch.Tensor, rel: float, abs: float) -> bool:
    return bool(((y.double() - exact).abs() <= rel * exact.abs() + abs).all())


def rope(constants=ROPE, rotary_dim=None, theta=10_000.0):
    return lambda x, pos: rope_triton.rope(x, pos, theta, MAX_POSITIONS, rotary_dim, **constants)


def residual(constants=ELEMENTWISE):
    return lambda x, r: residual_triton.add(x, r, **constants)


def activation(constants=ELEMENTWISE):
    return lambda gate, up: activation_triton.silu_mul(gate, up, **constants)


def rope_float64(x, pos, rotary_dim=None, theta=10_000.0):
    """The rotation with exact float64 angles."""
    x = x.double()
    rot = rotary_dim or x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=x.device) / rot)
    angle = pos.double()[:, None, None] * inv_freq  # [T, 1, rot / 2]
    x1, x2 = x[..., : rot // 2], x[..., rot // 2 : rot]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin(), x[..., rot:]], -1)


def silu_mul_float64(gate, up):
    gate = gate.double()
    return gate * torch.sigmoid(gate) * up.double()


# the contract's view: the reference's arguments and constants, and one launch


@pytest.mark.parametrize("region", list(FAMILIES))
def test_the_triton_impl_takes_exactly_the_references_arguments(region):
    _, fn, reference_fn, _ = FAMILIES[region]
    params = lambda f: [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]  # noqa: E731
    assert params(fn) == params(reference_fn)


def _registry() -> Registry:
    registry = Registry()
    for module, *_ in FAMILIES.values():
        module.register(registry)
    return registry


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
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "from isoexec.runtime.registry import Registry\n"
        "from isoexec.ops.rope import triton as a\nfrom isoexec.ops.residual import triton as b\n"
        "from isoexec.ops.activation import triton as c\n"
        "registry = Registry()\nfor m in (a, b, c): m.register(registry)\n"
        "assert len(registry) == 0\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# rope


@pytest.mark.parametrize("rotary_dim", [None, 10])
@pytest.mark.parametrize("dtype,rel,abs", [(torch.float32, 0.0, 1e-5), (torch.bfloat16, 2**-7, 1e-5)])
def test_rope_matches_float64(dtype, rel, abs, rotary_dim):
    x, pos = randn(9, 3, 16, seed=6, dtype=dtype), positions(9, seed=6)
    y = rope(boundary(ROPE, dtype), rotary_dim)(x, pos)
    assert y.shape == x.shape and y.dtype == dtype
    assert within(y, rope_float64(x, pos, rotary_dim), rel, abs)
    if rotary_dim:
        assert bitwise_equal(y[..., rotary_dim:], x[..., rotary_dim:])  # pass-through dims are copied


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not ON_GPU, reason="the interpreter truncates fp32 -> bf16, the reference rounds to nearest"))])
@pytest.mark.parametrize("rotary_dim", [None, 10])
def test_rope_gives_the_references_bits(dtype, rotary_dim):
    x, pos = randn(9, 3, 16, seed=7, dtype=dtype), positions(9, seed=7)
    constants = boundary(ROPE, dtype)
    expected = rope_reference.rope(x, pos, 10_000.0, MAX_POSITIONS, rotary_dim, **constants)
    assert bitwise_equal(rope(constants, rotary_dim)(x, pos), expected)


def test_rope_gradients_match_float64():
    x, pos, g = randn(5, 2, 16, seed=8), positions(5, seed=8), randn(5, 2, 16, seed=9)
    param = x.clone().requires_grad_()
    rope(rotary_dim=10)(param, pos).backward(g)
    exact = x.double().requires_grad_()
    rope_float64(exact, pos, 10).backward(g.double())
    assert (param.grad.double() - exact.grad).abs().max() < 1e-5


def _rope_rows(dtype=torch.float32):
    x = torch.cat([randn(17, 2, 16, seed=10), hazards(32).reshape(-1, 2, 16)]).to(dtype)
    return x, positions(len(x), seed=10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_rows_are_bitwise_invariant(dtype):
    x, pos = _rope_rows(dtype)
    op = rope(boundary(ROPE, dtype))
    assert batch_dependent(op, [x, pos]) == []
    assert batch_dependent(rope(boundary(ROPE, dtype), rotary_dim=8, theta=1e6), [x, pos]) == []
    assert bitwise_equal(op(strided(x), strided(pos)), op(x, pos))
    assert bitwise_equal(op(x.transpose(0, 1).contiguous().transpose(0, 1), pos), op(x, pos))  # token stride < head stride


def _rope_table_from_batch(x, pos):
    """A bf16 table once the batch is large enough."""
    return rope(ROPE | {"table_dtype": "float32" if x.shape[0] < 8 else "bfloat16"})(x, pos)


def test_rope_with_its_table_chosen_from_the_batch_is_caught():
    assert batch_dependent(_rope_table_from_batch, list(_rope_rows())), "the invariance check missed a batch-dependent rope"


def test_rope_positions_outside_the_table_give_nan_tokens_only():
    x = randn(4, 2, 16, seed=11)
    pos = torch.tensor([3, MAX_POSITIONS, -1, 7], device=DEVICE)
    y = rope()(x, pos)
    assert y[1:3].isnan().all()
    assert bitwise_equal(y[[0, 3]], rope()(x[[0, 3]], pos[[0, 3]]))


# residual


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
    x, r = _residual_rows(dtype)
    op = residual(boundary(ELEMENTWISE, dtype))
    assert batch_dependent(op, [x, r]) == []
    assert bitwise_equal(op(strided(x), r.T.contiguous().T), op(x, r))


def _residual_in_bf16_when_batched(x, r):
    """Rounds its inputs to bf16 once the batch is large enough."""
    if x.shape[0] >= 8:
        x, r = x.bfloat16().float(), r.bfloat16().float()
    return residual()(x, r)


def test_residual_computed_in_bf16_when_batched_is_caught():
    assert batch_dependent(_residual_in_bf16_when_batched, list(_residual_rows())), "the invariance check missed a batch-dependent add"


# activation


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
    params = [t.clone().requires_grad_() for t in (gate, up)]
    activation()(*params).backward(g)
    exact = [t.double().requires_grad_() for t in (gate, up)]
    silu_mul_float64(*exact).backward(g.double())
    for got, want in zip(params, exact):
        assert (got.grad.double() - want.grad).abs().max() < 1e-5


def _activation_rows(dtype=torch.float32):
    gate = torch.cat([randn(17, 40, seed=28, scale=4.0), hazards(40)]).to(dtype)
    return gate, torch.cat([randn(17, 40, seed=29), hazards(40).flip(0)]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_rows_are_bitwise_invariant(dtype):
    gate, up = _activation_rows(dtype)
    op = activation(boundary(ELEMENTWISE, dtype))
    assert batch_dependent(op, [gate, up]) == []
    assert bitwise_equal(op(strided(gate), up.T.contiguous().T), op(gate, up))


def _activation_in_bf16_when_batched(gate, up):
    """Rounds the gate to bf16 once the batch is large enough."""
    return activation()(gate.bfloat16().float() if gate.shape[0] >= 8 else gate, up)


def test_activation_computed_in_bf16_when_batched_is_caught():
    assert batch_dependent(_activation_in_bf16_when_batched, list(_activation_rows())), "the invariance check missed a batch-dependent silu"


# admission


def _contract_with(region: str, impl_id: str, constants: dict):
    """tiny-dense with `region` pinned to `impl_id`@1 and `constants` in every case."""
    contract = load_preset("tiny-dense")
    composition = tuple(
        dataclasses.replace(e, impl=ImplRef(id=impl_id, version=1), constants=constants) if e.region == region else e
        for e in contract.composition
    )
    return dataclasses.replace(contract, composition=composition)


SMALL_SIZES = (1, 3, 16)


def _small_rope_probe(ctx):
    """rope's probe with fewer tokens and batch sizes."""
    heads, head_dim, max_positions = rope_probe.HEADS, rope_probe.HEAD_DIM, rope_probe.MAX_POSITIONS
    x = torch.cat([ctx.randn(10, heads, head_dim), hazard_rows(ctx, heads * head_dim).reshape(-1, heads, head_dim)])
    pos = torch.cat([ctx.randint(max_positions, len(x) - 3), torch.tensor([0, 1, max_positions - 1], device=ctx.device)])
    yield from rowwise(ctx, [x, pos], 1_000_000.0, max_positions, sizes=SMALL_SIZES)
    yield from rowwise(ctx, [x, pos], 10_000.0, max_positions, head_dim // 2, sizes=(7,), label="partial rotary")


def _small_residual_probe(ctx):
    """residual's probe with fewer rows and batch sizes."""
    width = residual_probe.WIDTH
    x = torch.cat([ctx.randn(10, width), hazard_rows(ctx, width)])
    yield from rowwise(ctx, [x, torch.cat([ctx.randn(10, width), hazard_rows(ctx, width).neg()])], sizes=SMALL_SIZES)


def _small_activation_probe(ctx):
    """activation's probe with fewer rows and batch sizes."""
    width = activation_probe.WIDTH
    gate = torch.cat([ctx.randn(10, width, scale=4.0), hazard_rows(ctx, width)])
    yield from rowwise(ctx, [gate, torch.cat([ctx.randn(10, width), hazard_rows(ctx, width).flip(0)])], sizes=SMALL_SIZES)


BATTERY = {  # region: (the family's probe, a reduced probe, a batch-dependent variant of the impl)
    "rope": (rope_probe.probe, _small_rope_probe, lambda x, pos, *args, table_dtype, **constants: rope_triton.rope(
        x, pos, *args, table_dtype=table_dtype if x.shape[0] < 8 else "bfloat16", **constants)),
    "residual": (residual_probe.probe, _small_residual_probe, lambda x, r, **constants: residual_triton.add(
        x.bfloat16().to(x.dtype) if x.shape[0] >= 8 else x, r, **constants)),
    "activation": (activation_probe.probe, _small_activation_probe, lambda gate, up, **constants: activation_triton.silu_mul(
        gate.bfloat16().to(gate.dtype) if gate.shape[0] >= 8 else gate, up, **constants)),
}


def _battery(region: str, registry: Registry, probe):
    contract = _contract_with(region, f"{region}.triton", boundary(FAMILIES[region][3], torch.bfloat16))
    return validate_entry(contract, contract.entry(region, "trainer_fwd"), probe, registry=registry, device=DEVICE)


@pytest.mark.parametrize("region", list(BATTERY))
def test_the_battery_admits_the_triton_impl(region):
    """With the family's own probe, in the interpreter too (a few seconds each)."""
    result = _battery(region, _registry(), BATTERY[region][0])
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == ("bfloat16", "float32") and result.trials >= 300


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
