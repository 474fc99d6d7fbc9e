"""Token embedding as an exact gather: each output row is a bit copy of a table row.

The table's gradient sums, for each row, the gradients of every position that read it. `index_select`'s own
backward does that with `index_add_`, which on a GPU adds by atomics in whatever order the threads reach
them: a row read twice gets last-bit different gradients from one run to the next, and a resumed RL run no
longer follows the one never stopped. Here the sum is `index_put_` with accumulate, which sorts the
positions and adds each row's in position order on every device, so a step's gradient is the same bits
run to run. It adds in float32 (float64 gradients in float64) and rounds once: a row read by hundreds of
positions (a frequent token) would lose most of its bits to a bfloat16 running sum.
"""

import torch
from torch import Tensor

from ..common import expect_dtype


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, ids):
        ctx.save_for_backward(ids)
        ctx.rows = weight.shape[0]
        return weight.index_select(0, ids)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        wide = torch.promote_types(grad.dtype, torch.float32)  # float64 stays float64
        summed = grad.new_zeros((ctx.rows, grad.shape[-1]), dtype=wide).index_put_((ids,), grad.to(wide), accumulate=True)
        return summed.to(grad.dtype), None


def embedding(ids: Tensor, weight: Tensor, *, output_dtype: str) -> Tensor:
    """ids [...] int64, weight [V, H] -> [..., H]."""
    expect_dtype(weight, output_dtype, "embedding table")
    flat = ids.reshape(-1)
    rows = _Gather.apply(weight, flat) if torch.is_grad_enabled() and weight.requires_grad else weight.index_select(0, flat)
    return rows.reshape(*ids.shape, weight.shape[-1])
