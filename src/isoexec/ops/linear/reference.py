"""Batch-invariant y = x Wᵀ (+ b): no split-K, fixed K blocking, fp32 accumulation, one rounding.

Row r, column n is computed as: products x[r, k] * W[n, k] in the accumulation dtype; K split into
`num_leaves` contiguous leaves; inside a leaf, blocks of `block_k` products reduced by `block_tree`
and the block sums by `tree`; the leaf partials combined by `leaf_tree`; bias added; rounded once.
Nothing in that sequence depends on M, on which rows share the call, or on the tiling below.

With `num_leaves = 1` this is the plain column-parallel linear; row-parallel layers use more leaves so
that a tensor-parallel rank owning a contiguous run of leaves computes exactly its subtree
(`leaf_partials` on its shard, then `combine_leaves` over the gathered partials).

The backward pass uses ordinary matmuls: gradients must be correct, not batch-invariant.
"""

import torch
from torch import Tensor

from ..common import TILE_ELEMENTS, expect_dtype, torch_dtype
from ..reduce import blocked_sum, tree_sum


def leaf_partials(x: Tensor, weight: Tensor, *, num_leaves: int, block_k: int, block_tree: str, tree: str, accum: torch.dtype) -> Tensor:
    """Per-leaf partial sums: x [M, K], weight [N, K] -> [M, N, num_leaves] in `accum`."""
    m, k = x.shape
    n = weight.shape[0]
    if k % num_leaves:
        raise ValueError(f"K = {k} is not divisible into {num_leaves} leaves")
    leaf = k // num_leaves
    out = x.new_empty((m, n, num_leaves), dtype=accum)
    xf, wf = x.to(accum).reshape(m, 1, num_leaves, leaf), weight.to(accum).reshape(1, n, num_leaves, leaf)
    cols = max(1, min(n, TILE_ELEMENTS // max(1, k)))
    rows = max(1, TILE_ELEMENTS // (cols * max(1, k)))
    for r0 in range(0, m, rows):
        for c0 in range(0, n, cols):
            products = xf[r0 : r0 + rows] * wf[:, c0 : c0 + cols]  # [rows, cols, G, K/G]
            out[r0 : r0 + rows, c0 : c0 + cols] = blocked_sum(products, block_k, block_tree, tree)
    return out


def combine_leaves(partials: Tensor, leaf_tree: str) -> Tensor:
    """[M, N, G] leaf partials -> [M, N], by the fixed leaf tree (lower leaf on the left)."""
    return tree_sum(partials, leaf_tree)


def linear_grads(ctx, grad: Tensor) -> tuple:
    """(grad_x, grad_w, grad_b) of y = x Wᵀ + b by ordinary matmuls, for any linear impl whose
    autograd Function saved (x, weight) and `has_bias`: gradients must be correct, not invariant.

    On a GPU the matmuls take the weight's dtype, as F.linear's own backward does (bf16 tensor cores,
    fp32 accumulation inside); promoting them to fp32 ran them on the CUDA cores and took half of a
    training step's GPU time (benchmarks/profile_gpu.py trainer, docs/experiments.md). On the CPU they
    run in fp32 at least."""
    x, weight = ctx.saved_tensors
    dtype = weight.dtype if grad.is_cuda else torch.promote_types(weight.dtype, torch.float32)
    g = grad.reshape(-1, weight.shape[0]).to(dtype)
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = (g @ weight.to(g.dtype)).to(x.dtype).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        grad_w = (g.T @ x.reshape(-1, x.shape[-1]).to(g.dtype)).to(weight.dtype)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = g.sum(0).to(weight.dtype)
    return grad_x, grad_w, grad_b


class _InvariantLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, out_dtype, accum, num_leaves, block_k, block_tree, tree, leaf_tree):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        k = x.shape[-1]
        acc = combine_leaves(
            leaf_partials(x.reshape(-1, k), weight, num_leaves=num_leaves, block_k=block_k, block_tree=block_tree, tree=tree, accum=accum),
            leaf_tree,
        )
        if bias is not None:
            acc = acc + bias.to(accum)
        return acc.to(out_dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        return (*linear_grads(ctx, grad), None, None, None, None, None, None, None)


def _linear(x, weight, bias, input_dtype, weight_dtype, output_dtype, accum_dtype, block_k, block_tree, tree, num_leaves, leaf_tree):
    expect_dtype(x, input_dtype, "linear input")
    expect_dtype(weight, weight_dtype, "linear weight")
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: input has K = {x.shape[-1]}, weight has K = {weight.shape[-1]}")
    return _InvariantLinear.apply(
        x, weight, bias, torch_dtype(output_dtype), torch_dtype(accum_dtype), num_leaves, block_k, block_tree, tree, leaf_tree
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, input_dtype: str, weight_dtype: str, output_dtype: str,
           accum_dtype: str, block_k: int, block_tree: str, tree: str) -> Tensor:
    """x [..., K], weight [N, K], bias [N] -> [..., N]."""
    return _linear(x, weight, bias, input_dtype, weight_dtype, output_dtype, accum_dtype, block_k, block_tree, tree, 1, "sequential")


def row_parallel_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, input_dtype: str, weight_dtype: str,
                        output_dtype: str, accum_dtype: str, block_k: int, block_tree: str, tree: str, num_leaves: int,
                        leaf_tree: str) -> Tensor:
    """As `linear`, with K split into `num_leaves` leaves combined by `leaf_tree`."""
    return _linear(x, weight, bias, input_dtype, weight_dtype, output_dtype, accum_dtype, block_k, block_tree, tree, num_leaves, leaf_tree)
