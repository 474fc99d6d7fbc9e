"""Sibling projections of one input (q, k and v; gate and up) as one call over their joined weights.

The model keeps sibling weights as consecutive rows of one tensor (`model/layers/params.join`), so the
rows [N_1 + N_2 + …, K] are one weight and the siblings' outputs are its output's columns. An impl
that can compute each column as its own call computes it (`linear.triton`: the same tile at the same
place in the tile, only the store address moves; `linear.reference`: each output element is its own
products and sum) gives each sibling its own call's bits from one launch. `joined_op` wraps such an
impl's `joined` forward for the model: it returns None where the weights are not joined in memory (a
model built another way, a tensor-parallel shard), and the model then calls the siblings one by one.

The backward is one pair of ordinary matmuls over the joined weight, as `reference.linear_grads` does
for one weight: gradients must be correct, not batch-invariant.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch
from torch import Tensor

from ..triton_support import needs_grad
from .reference import linear_grads


def joined(tensors) -> Tensor | None:
    """The tensors as one tensor of their rows, where they are consecutive contiguous rows of one storage
    (a view, nothing copied); else None."""
    first = tensors[0]
    if first is None or not first.is_contiguous():
        return None
    storage, size = first.untyped_storage().data_ptr(), first.element_size()
    rows, end = first.shape[0], first.data_ptr() + first.numel() * size
    for t in tensors[1:]:
        if (t is None or t.dtype != first.dtype or t.shape[1:] != first.shape[1:] or not t.is_contiguous()
                or t.data_ptr() != end or t.untyped_storage().data_ptr() != storage):
            return None
        rows, end = rows + t.shape[0], end + t.numel() * size
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride())


class _Joined(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forward, weight, bias, widths, *params):
        ctx.save_for_backward(x, weight)
        ctx.widths, ctx.has_bias = widths, bias is not None
        return tuple(forward(x, weight, bias, widths))

    @staticmethod
    def backward(ctx, *grads):
        x, weight = ctx.saved_tensors
        count = len(ctx.widths)
        needs = ctx.needs_input_grad
        grad = torch.cat([g if g is not None else x.new_zeros(x.shape[0], w) for g, w in zip(grads, ctx.widths)], dim=-1)
        shim = SimpleNamespace(saved_tensors=(x, weight), has_bias=ctx.has_bias,
                               needs_input_grad=(needs[0], any(needs[5 : 5 + count]), any(needs[5 + count :])))
        grad_x, grad_w, grad_b = linear_grads(shim, grad)
        parts_w = grad_w.split(ctx.widths) if grad_w is not None else (None,) * count
        parts_b = (grad_b.split(ctx.widths) if grad_b is not None else (None,) * count) if ctx.has_bias else ()
        return (grad_x, None, None, None, None, *parts_w, *parts_b)


def joined_op(forward: Callable, can_join: Callable[[list[int]], bool]) -> Callable:
    """(x [M, K], weights, biases) -> one output per weight, from `forward(x, weight, bias, widths)` ->
    [parts] over the joined weight; None where the weights are not joined or `can_join(widths)` refuses."""

    def op(x: Tensor, weights: list[Tensor], biases: list[Tensor | None]):
        weight = joined(weights)
        has_bias = biases[0] is not None
        bias = joined(biases) if has_bias else None
        if weight is None or x.dim() != 2 or (has_bias and bias is None):
            return None
        widths = [w.shape[0] for w in weights]
        if not can_join(widths):
            return None
        params = (*weights, *biases) if has_bias else tuple(weights)
        if needs_grad(x, *params):
            return _Joined.apply(x, forward, weight, bias, widths, *params)
        return forward(x, weight, bias, widths)

    return op
