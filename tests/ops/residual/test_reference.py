"""residual: the add rounds once."""

import torch

from conftest import bitwise_equal
from isoexec.ops.residual import reference as res


def test_residual_add_rounds_once():
    a, b = torch.randn(8, 5).bfloat16(), torch.randn(8, 5).bfloat16()
    out = res.add(a, b, input_dtype="bfloat16", output_dtype="bfloat16", compute_dtype="float32")
    assert bitwise_equal(out, (a.float() + b.float()).bfloat16())
