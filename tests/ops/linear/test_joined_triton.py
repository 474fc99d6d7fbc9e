"""linear.triton's joined call (`joined_fwd`): sibling weights joined in memory as one launch, every part
bitwise its own `linear` call, through the grid launch (few rows) and the persistent one (many rows), with
and without bias; parts that are not whole column tiles are refused (the model then calls them apart).
The comparison's power to see a regrouped sum is shown on the reference's joined call (test_joined.py)."""

import pytest
import torch

from conftest import BATTERY_DTYPES, INTERPRETER_WARNINGS, bitwise_equal, boundary, randn, require_triton

require_triton()

from isoexec.ops.linear import triton as linear_triton  # noqa: E402
from isoexec.ops.linear.joined import joined_op  # noqa: E402
from ops.kernels_triton import LINEAR  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

WIDTHS = [64, 32, 32]  # whole 32-column tiles (LINEAR's block_n)


@pytest.mark.parametrize("dtype", BATTERY_DTYPES)
@pytest.mark.parametrize("rows", [5, linear_triton.PERSISTENT_MIN_ROWS + 6])  # grid launch, persistent launch
@pytest.mark.parametrize("widths, bias", [(WIDTHS, True), ([64, 32], False)])
def test_parts_are_bitwise_their_own_calls(dtype, rows, widths, bias):
    dtype = getattr(torch, dtype)
    constants = boundary(LINEAR, dtype)
    whole = randn(sum(widths), 40, seed=1, scale=40**-0.5, dtype=dtype)
    whole_b = randn(sum(widths), seed=2, dtype=dtype)
    weights = list(whole.split(widths))
    biases = list(whole_b.split(widths)) if bias else [None] * len(widths)
    x = randn(rows, 40, seed=3, dtype=dtype)
    op = joined_op(lambda x, w, b, widths: linear_triton.joined_fwd(x, w, b, widths, **constants),
                   lambda widths: linear_triton.can_join(widths, **constants))
    parts = op(x, weights, biases)
    assert parts is not None and [p.shape for p in parts] == [(rows, w) for w in widths]
    assert all(p.is_contiguous() for p in parts)
    alone = [linear_triton.linear(x, w, b, **constants) for w, b in zip(weights, biases)]
    assert all(bitwise_equal(p, a) for p, a in zip(parts, alone))


def test_parts_that_are_not_whole_tiles_are_refused():
    assert linear_triton.can_join([64, 32, 32], **LINEAR)
    assert not linear_triton.can_join([48, 16], **LINEAR)  # a tile would hold columns of both
    assert not linear_triton.can_join([32, 32, 32, 32], **LINEAR)  # at most three parts
