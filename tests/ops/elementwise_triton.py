"""What the Triton tests of the elementwise families (rope, residual, activation) share: their float32
constants, the calls, the registry of the three impls, and the battery's reduced probes and
batch-dependent variants (tests/ops/{rope,residual,activation}/test_triton.py and
tests/ops/triton/test_elementwise_impls.py, which holds the tests that are the same for the three).

Without a GPU the kernels run in Triton's interpreter (see tests/ops/linear/test_triton.py for why
TRITON_INTERPRET is set before anything imports triton), so shapes are small; the battery admits each
impl with its family's own probe and shows a batch-dependent variant rejected with a reduced one. The
interpreter truncates fp32 -> bf16 where the GPU and torch round to nearest, so bf16 results equal the
reference's bits only on a GPU.

Import it only after `conftest.require_triton()`: it imports the Triton modules.
"""

import torch

from conftest import DEVICE, batch_dependent, bitwise_equal, boundary
from isoexec.ops.activation import probe as activation_probe
from isoexec.ops.activation import reference as activation_reference
from isoexec.ops.activation import triton as activation_triton
from isoexec.ops.residual import probe as residual_probe
from isoexec.ops.residual import reference as residual_reference
from isoexec.ops.residual import triton as residual_triton
from isoexec.ops.rope import probe as rope_probe
from isoexec.ops.rope import reference as rope_reference
from isoexec.ops.rope import triton as rope_triton
from isoexec.runtime.registry import Registry
from isoexec.validate.battery import hazard_rows, rowwise, strided
from ops.triton_impls import SMALL_SIZES, registry_of, validate_pinned

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


def assert_two_inputs_rows_are_bitwise_invariant(op, a: torch.Tensor, b: torch.Tensor) -> None:
    """A row of `op(a, b)` (residual's add, activation's silu_mul) has the same bits alone and in any
    batch, and from a strided `a` and a column-major `b`."""
    assert batch_dependent(op, [a, b]) == []
    assert bitwise_equal(op(strided(a), b.T.contiguous().T), op(a, b))


def _registry() -> Registry:
    return registry_of(*(module for module, *_ in FAMILIES.values()))


# admission


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
    return validate_pinned(region, f"{region}.triton", boundary(FAMILIES[region][3], torch.bfloat16), probe, registry)
