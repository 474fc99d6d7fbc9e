"""rope.triton, the rotary embedding from a table built in float64 on the CPU: float64 agreement of
values and gradients (partial rotary and YaRN included), the reference's bits (bf16 on a GPU only), bitwise
invariance to the batch and strides next to a table chosen from the batch, and NaN tokens for positions
outside the table. The tests that are the same for rope, residual and activation are in
tests/ops/triton/test_elementwise_impls.py; how these run without a GPU, and the shared helpers, in
tests/ops/elementwise_triton.py.
"""

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from isoexec.ops.rope import reference as rope_reference, scaling as rope_scaling, triton as rope_triton  # noqa: E402
from isoexec.validate.battery import strided  # noqa: E402
from ops.elementwise_triton import MAX_POSITIONS, ROPE, positions, rope, within  # noqa: E402
from ops.triton_impls import assert_gradients_match_float64  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

# Its ramp spans dims 0..4 at theta 10000 and 16 dims, and its attention factor is not 1.
YARN = rope_scaling.Yarn(factor=4.0, original_max_position_embeddings=512)


def rope_float64(x, pos, rotary_dim=None, theta=10_000.0, scaling=None):
    """The rotation with exact float64 angles (YaRN's frequencies as tests/ops/rope/test_scaling.py checks them)."""
    x = x.double()
    rot = rotary_dim or x.shape[-1]
    if scaling is None:
        inv_freq = theta ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=x.device) / rot)
    else:
        inv_freq = rope_scaling.inv_freq(theta, rot, scaling).to(x.device)
    angle = pos.double()[:, None, None] * inv_freq  # [T, 1, rot / 2]
    cos, sin = angle.cos() * rope_scaling.attention_factor(scaling), angle.sin() * rope_scaling.attention_factor(scaling)
    x1, x2 = x[..., : rot // 2], x[..., rot // 2 : rot]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rot:]], -1)


def scaled_rope(constants=ROPE, rotary_dim=None, scaling=YARN):
    return lambda x, pos: rope_triton.rope(x, pos, 10_000.0, MAX_POSITIONS, rotary_dim, scaling, **constants)


@pytest.mark.parametrize("rotary_dim", [None, 10])
@pytest.mark.parametrize("dtype,rel,abs", [(torch.float32, 0.0, 1e-5), (torch.bfloat16, 2**-7, 1e-5)])
def test_rope_matches_float64(dtype, rel, abs, rotary_dim):
    x, pos = randn(9, 3, 16, seed=6, dtype=dtype), positions(9, seed=6)
    y = rope(boundary(ROPE, dtype), rotary_dim)(x, pos)
    assert y.shape == x.shape and y.dtype == dtype
    assert within(y, rope_float64(x, pos, rotary_dim), rel, abs)
    if rotary_dim:
        assert bitwise_equal(y[..., rotary_dim:], x[..., rotary_dim:])  # pass-through dims are copied


@pytest.mark.parametrize("rotary_dim", [None, 10])
def test_rope_with_yarn_matches_float64(rotary_dim):
    x, pos = randn(9, 3, 16, seed=6), positions(9, seed=6)
    assert within(scaled_rope(ROPE, rotary_dim)(x, pos), rope_float64(x, pos, rotary_dim, scaling=YARN), 0.0, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not ON_GPU, reason="the interpreter truncates fp32 -> bf16, the reference rounds to nearest"))])
@pytest.mark.parametrize("rotary_dim", [None, 10])
@pytest.mark.parametrize("scaling", [None, YARN], ids=["plain", "yarn"])
def test_rope_gives_the_references_bits(dtype, rotary_dim, scaling):
    x, pos = randn(9, 3, 16, seed=7, dtype=dtype), positions(9, seed=7)
    constants = boundary(ROPE, dtype)
    expected = rope_reference.rope(x, pos, 10_000.0, MAX_POSITIONS, rotary_dim, scaling, **constants)
    assert bitwise_equal(scaled_rope(constants, rotary_dim, scaling)(x, pos), expected)


@pytest.mark.parametrize("scaling", [None, YARN], ids=["plain", "yarn"])
def test_rope_gradients_match_float64(scaling):
    x, pos, g = randn(5, 2, 16, seed=8), positions(5, seed=8), randn(5, 2, 16, seed=9)
    assert_gradients_match_float64(lambda x: scaled_rope(rotary_dim=10, scaling=scaling)(x, pos), lambda x: rope_float64(x, pos, 10, scaling=scaling),
                                   [x], g, 1e-5)


@pytest.mark.skipif(not ON_GPU, reason="the backward takes the kernel on a GPU only")
@pytest.mark.parametrize("dtype,table_dtype", [(torch.float32, "float32"), (torch.bfloat16, "float32"), (torch.bfloat16, "bfloat16")])
@pytest.mark.parametrize("scaling", [None, YARN], ids=["plain", "yarn"])
def test_rope_backward_kernel_gives_the_ops_bits(dtype, table_dtype, scaling):
    """On a GPU the backward is the forward kernel over the sin-negated table: `_rotate_back`'s bits. The
    control: the forward rotation of the same gradient (+angle instead of -angle) differs."""
    x = randn(33, 3, 16, seed=11, dtype=dtype).transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # strided rows
    pos, g = positions(33, seed=11), randn(33, 3, 16, seed=12, dtype=dtype)
    constants = boundary(ROPE, dtype) | {"table_dtype": table_dtype}
    scaled_rope(constants, 10, scaling)(x, pos).backward(g)
    table = rope_reference.cos_sin_table(10_000.0, 10, MAX_POSITIONS, table_dtype, str(x.device), scaling)
    expected = rope_triton._rotate_back(g, pos, table).to(dtype)
    assert bitwise_equal(x.grad, expected)
    assert not bitwise_equal(x.grad, scaled_rope(constants, 10, scaling)(g, pos))


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
