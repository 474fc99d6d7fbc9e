"""Batch-invariant y = x Wᵀ (+ b): no split-K, fixed K blocking, fp32 accumulation, one rounding.

Row r, column n is computed as: products x[r, k] * W[n, k] in the accumulation dtype; K split into
`num_leaves` contiguous leaves by `leaf_bounds`; inside a leaf, blocks of `block_k` products from the
leaf's first column (the last block may be partial) reduced by `block_tree` and the block sums by
`tree`; the leaf partials combined by `leaf_tree`; bias added; rounded once. Nothing in that sequence
depends on M, on which rows share the call, or on the tiling below.

With `num_leaves = 1` this is the plain column-parallel linear; row-parallel layers use more leaves so
that a tensor-parallel rank owning a contiguous run of leaves (`rank_leaves`, columns `leaf_columns`)
computes exactly its subtree (`leaf_partials` on its shard, then `combine_leaves` over the gathered
partials).

The backward pass uses ordinary matmuls: gradients must be correct, not batch-invariant.
"""

import math

import torch
from torch import Tensor

from ..common import TILE_ELEMENTS, expect_dtype, torch_dtype
from ..reduce import blocked_sum, tree_sum


def leaf_bounds(k: int, num_leaves: int) -> list[int]:
    """Where each of K's `num_leaves` = G leaves starts, then K: leaf i is columns [bounds[i], bounds[i + 1]),
    bounds[i] = floor(i K / G).

    One rule for every K, so that a model whose K the leaf count does not divide runs the same tree.
    Where G divides K it gives the K/G-wide leaves the contract always had (so no admitted bits move);
    elsewhere the widths differ by at most one. And since floor((r G/C) K / G) = floor(r K / C), rank r
    at TP = C (C dividing G) owns columns [floor(r K / C), floor((r + 1) K / C)): a shard cut from K and
    the rank alone, whose leaves the rank can cut again without seeing the others (`shard_bounds`)."""
    if not isinstance(num_leaves, int) or num_leaves < 1:
        raise ValueError(f"num_leaves must be a positive int, got {num_leaves!r}")
    return [i * k // num_leaves for i in range(num_leaves + 1)]


def rank_leaves(num_leaves: int, rank: int, tp: int) -> range:
    """The leaves rank `rank` of `tp` owns: the contiguous run [rank G/tp, (rank + 1) G/tp)."""
    if tp < 1 or num_leaves % tp or not 0 <= rank < tp:
        raise ValueError(f"rank {rank} of TP = {tp}: TP must divide the {num_leaves} leaves")
    per_rank = num_leaves // tp
    return range(rank * per_rank, (rank + 1) * per_rank)


def leaf_columns(k: int, num_leaves: int, leaves: range) -> slice:
    """The K columns under a contiguous run of leaves: a rank's shard of x and of the weight."""
    bounds = leaf_bounds(k, num_leaves)
    return slice(bounds[leaves.start], bounds[leaves.stop])


def shard_bounds(width: int, num_leaves: int, leaves: range, global_k: int | None = None) -> list[int]:
    """`leaf_bounds` of the run `leaves` of `global_k` (default `width`: all of K) columns, counted
    from the run's first column: where each of those leaves starts in a shard `width` columns wide
    holding just their columns, then `width`. Refuses a shard that is not those leaves' columns."""
    global_k = width if global_k is None else global_k
    if leaves.step != 1 or not 0 <= leaves.start <= leaves.stop <= num_leaves:
        raise ValueError(f"leaves {leaves} are not a contiguous run of the {num_leaves} leaves")
    bounds = leaf_bounds(global_k, num_leaves)[leaves.start : leaves.stop + 1]
    if bounds[-1] - bounds[0] != width:
        raise ValueError(f"K = {width} is not the width of leaves {leaves.start}..{leaves.stop - 1} of K = {global_k} "
                         f"in {num_leaves} leaves ({bounds[-1] - bounds[0]} columns)")
    return [b - bounds[0] for b in bounds]


def leaf_partials(x: Tensor, weight: Tensor, *, num_leaves: int, block_k: int, block_tree: str, tree: str, accum: torch.dtype,
                  global_k: int | None = None, leaves: range | None = None) -> Tensor:
    """Per-leaf partial sums: x [M, K], weight [N, K] -> [M, N, num_leaves] in `accum`, K cut by `leaf_bounds`.

    A tensor-parallel rank passes the whole weight's `global_k` and the leaves it owns (`rank_leaves`);
    x and weight then hold just their columns (`leaf_columns`) -> [M, N, len(leaves)]. A leaf's sums
    depend only on its own columns and width, so those are the whole weight's partials, bit for bit."""
    m, k = x.shape
    bounds = shard_bounds(k, num_leaves, range(num_leaves) if leaves is None else leaves, global_k)
    widths = [end - start for start, end in zip(bounds, bounds[1:])]
    if len(set(widths)) == 1:  # leaves of one width are a view of K, no gather needed
        shape = (len(widths), widths[0])
        return _leaf_sums(x.reshape(m, *shape), weight.reshape(weight.shape[0], *shape), block_k, block_tree, tree, accum)
    out = x.new_empty((m, weight.shape[0], len(widths)), dtype=accum)
    # Leaves of one width are gathered side by side and summed in one pass; there are two widths.
    for width in sorted(set(widths)):
        group = [i for i, w in enumerate(widths) if w == width]
        columns = torch.tensor([bounds[i] for i in group], device=x.device)[:, None] + torch.arange(width, device=x.device)
        out[..., group] = _leaf_sums(x[:, columns], weight[:, columns], block_k, block_tree, tree, accum)
    return out


def _leaf_sums(x: Tensor, weight: Tensor, block_k: int, block_tree: str, tree: str, accum: torch.dtype) -> Tensor:
    """x [M, L, W], weight [N, L, W]: L leaves of W columns each -> [M, N, L], each leaf's products by `blocked_sum`."""
    m, num_leaves, width = x.shape
    n, k = weight.shape[0], num_leaves * width
    out = x.new_empty((m, n, num_leaves), dtype=accum)
    xf, wf = x.to(accum)[:, None], weight.to(accum)[None]  # [M, 1, L, W], [1, N, L, W]
    cols = max(1, min(n, TILE_ELEMENTS // max(1, k)))
    rows = max(1, TILE_ELEMENTS // (cols * max(1, k)))
    for r0 in range(0, m, rows):
        for c0 in range(0, n, cols):
            products = xf[r0 : r0 + rows] * wf[:, c0 : c0 + cols]  # [rows, cols, L, W]
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
    if grad.is_cuda and x.dim() == 2 and grad.dtype == x.dtype == weight.dtype:
        # The same products as below without its casts and reshapes, which are no-ops here and cost
        # host time (~200 of these a training step, and a small step is host-bound).
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        return (grad @ weight if need_x else None, grad.T @ x if need_w else None,
                grad.sum(0) if ctx.has_bias and need_b else None)
    dtype = weight.dtype if grad.is_cuda else torch.promote_types(weight.dtype, torch.float32)
    g = grad.reshape(math.prod(grad.shape[:-1]), weight.shape[0]).to(dtype)  # N may be 0 (a rank holding no vocabulary)
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


def row_parallel_partials(x: Tensor, weight: Tensor, *, leaves: range, global_k: int, input_dtype: str, weight_dtype: str,
                          accum_dtype: str, block_k: int, block_tree: str, tree: str, num_leaves: int, **_) -> Tensor:
    """A tensor-parallel rank's half of `row_parallel_linear`: x [..., K_r] and weight [N, K_r], the columns of
    `leaves` of the whole weight's `global_k` -> their partials [M, N, len(leaves)] in the accumulation dtype,
    the whole weight's leaf partials bit for bit (`leaf_partials`)."""
    expect_dtype(x, input_dtype, "linear input")
    expect_dtype(weight, weight_dtype, "linear weight")
    return leaf_partials(x.reshape(-1, x.shape[-1]), weight, num_leaves=num_leaves, block_k=block_k, block_tree=block_tree, tree=tree,
                         accum=torch_dtype(accum_dtype), global_k=global_k, leaves=leaves)


def row_parallel_fold(partials: Tensor, bias: Tensor | None, *, output_dtype: str, accum_dtype: str, leaf_tree: str, **_) -> Tensor:
    """The other half: all G leaf partials [M, N, G] (every rank's, in leaf order) -> [M, N], by the leaf tree,
    bias added, rounded once: what `row_parallel_linear` does after its partials."""
    acc = combine_leaves(partials, leaf_tree)
    if bias is not None:
        acc = acc + bias.to(torch_dtype(accum_dtype))
    return acc.to(torch_dtype(output_dtype))


def row_parallel_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, input_dtype: str, weight_dtype: str,
                        output_dtype: str, accum_dtype: str, block_k: int, block_tree: str, tree: str, num_leaves: int,
                        leaf_tree: str) -> Tensor:
    """As `linear`, with K split into `num_leaves` leaves combined by `leaf_tree`."""
    return _linear(x, weight, bias, input_dtype, weight_dtype, output_dtype, accum_dtype, block_k, block_tree, tree, num_leaves, leaf_tree)


def joined_linear(x: Tensor, weight: Tensor, bias: Tensor | None, widths: list[int], **constants) -> list[Tensor]:
    """Sibling weights joined as weight [sum(widths), K] (`joined.py`) -> one output per part: every
    output element is its own products and blocked sum, so each part is bitwise its own call."""
    return [part.contiguous() for part in linear(x, weight, bias, **constants).split(widths, dim=-1)]


def can_join(widths: list[int], **_) -> bool:
    """Any two or more parts (linear.native's joined call takes the same)."""
    return len(widths) > 1

