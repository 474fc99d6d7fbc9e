"""rope: correctness, gradients, batch invariance."""

import math

import pytest
import torch

from conftest import batch_dependent, bitwise_equal
from isoexec.ops.rope import native as rope_native, reference as rope

ROPE = dict(table_dtype="float32", compute_dtype="float32", table_build="cpu_float64")


def _rope(dtype):
    name = str(dtype).removeprefix("torch.")
    return lambda x, pos, theta=10000.0, rot=None: rope.rope(x, pos, theta, 4096, rot, input_dtype=name, output_dtype=name, **ROPE)


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_rope_matches_a_float64_rotation(rotary_dim):
    g = torch.Generator().manual_seed(0)
    x, pos = torch.randn(30, 2, 16, generator=g), torch.randint(0, 4096, (30,), generator=g)
    got = _rope(torch.float32)(x, pos, 10000.0, rotary_dim).double()
    rot = rotary_dim or 16
    inv = 10000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = pos.double()[:, None, None] * inv
    x1, x2 = x[..., : rot // 2].double(), x[..., rot // 2 : rot].double()
    exact = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin(), x[..., rot:].double()], -1)
    assert (got - exact).abs().max() < 1e-5
    if rotary_dim:
        assert bitwise_equal(got[..., rot:].float(), x[..., rot:])  # pass-through dims are copied
    assert (_rope(torch.float32)(x, torch.zeros(30, dtype=torch.long)) - x).abs().max() == 0


def test_rope_table_entries_do_not_depend_on_table_length():
    short = rope.cos_sin_table(10000.0, 16, 100, "float32", "cpu")
    long = rope.cos_sin_table(10000.0, 16, 5000, "float32", "cpu")
    assert bitwise_equal(short, long[:100])


def test_rope_native_is_close_to_the_reference():
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(20, 2, 16, generator=g).bfloat16(), torch.randint(0, 2048, (20,), generator=g)
    ours = _rope(torch.bfloat16)(x, pos).float()
    fast = rope_native.rope(x, pos, 10000.0, 4096, input_dtype="bfloat16", output_dtype="bfloat16").float()
    assert (ours - fast).abs().max() < 0.05


@pytest.mark.parametrize(
    "op,inputs",
    [
        (lambda x, pos: rope.rope(x, pos, 500.0, 64, input_dtype="float64", output_dtype="float64", table_dtype="float64", compute_dtype="float64", table_build="cpu_float64"),
         lambda g: (torch.randn(3, 2, 8, dtype=torch.float64, generator=g, requires_grad=True), torch.tensor([0, 5, 63]))),
    ],
    ids=["rope"],
)
def test_gradients_match_float64_finite_differences(op, inputs):
    assert torch.autograd.gradcheck(op, inputs(torch.Generator().manual_seed(3)))


def test_rope_is_batch_invariant():
    g = torch.Generator().manual_seed(4)
    x, pos = torch.randn(40, 2, 16, generator=g).bfloat16(), torch.randint(0, 4096, (40,), generator=g)
    assert batch_dependent(_rope(torch.bfloat16), [x, pos]) == []
    assert math.isfinite(float(_rope(torch.bfloat16)(x, pos).float().abs().max()))
