"""Reductions written as fixed sequences of elementwise IEEE operations.

Every function here reduces the last dimension of a tensor with an order that depends only on that
dimension's length — never on the other dimensions, the device's thread count, or the library — so a
row's bits are the same alone or in any batch. Each step is one elementwise add (or maximum) over
slices, and elementwise adds are correctly rounded on every backend.

Shapes: the reduced dimension is last; `n` is its length. A reduction tree is one of
- `balanced_binary`: pad to a power of two with the identity, then repeatedly add the upper half onto
  the lower half (element i meets element i + n/2);
- `sequential`: fold left to right, ((x0 + x1) + x2) + ….
"""

import torch
from torch import Tensor

TREES = ("balanced_binary", "sequential")


def _pad_last(x: Tensor, length: int, value: float) -> Tensor:
    if x.shape[-1] == length:
        return x
    pad = x.new_full((*x.shape[:-1], length - x.shape[-1]), value)
    return torch.cat([x, pad], dim=-1)


def _fold(x: Tensor, tree: str, combine, identity: float) -> Tensor:
    n = x.shape[-1]
    if n == 0:
        return x.new_full(x.shape[:-1], identity)
    if tree == "sequential":
        out = x[..., 0]
        for i in range(1, n):
            out = combine(out, x[..., i])
        return out
    if tree != "balanced_binary":
        raise ValueError(f"unknown reduction tree {tree!r} (known: {', '.join(TREES)})")
    width = 1 << (n - 1).bit_length()
    x = _pad_last(x, width, identity)
    while width > 1:
        width //= 2
        x = combine(x[..., :width], x[..., width:])
    return x[..., 0]


def tree_sum(x: Tensor, tree: str = "balanced_binary") -> Tensor:
    """Sum over the last dim by a fixed tree (padding with +0.0, which never changes a sum's bits
    except turning an all-(-0.0) sum into +0.0, a function of n alone)."""
    return _fold(x, tree, torch.add, 0.0)


def tree_max(x: Tensor, tree: str = "balanced_binary") -> Tensor:
    """Maximum over the last dim by a fixed tree, so which of ±0.0 (or of equal values) wins is fixed."""
    return _fold(x, tree, torch.maximum, float("-inf"))


def blocked(x: Tensor, block: int, fill: float) -> Tensor:
    """Split the last dim into blocks of `block` (the last one padded with `fill`): [..., n] -> [..., n_blocks, block]."""
    n = x.shape[-1]
    n_blocks = max(1, -(-n // block))
    return _pad_last(x, n_blocks * block, fill).reshape(*x.shape[:-1], n_blocks, block)


def blocked_sum(x: Tensor, block: int, block_tree: str = "balanced_binary", tree: str = "sequential") -> Tensor:
    """Sum over the last dim: each block of `block` elements by `block_tree`, the block sums by `tree`."""
    return tree_sum(tree_sum(blocked(x, block, 0.0), block_tree), tree)


def blocked_max(x: Tensor, block: int, block_tree: str = "balanced_binary", tree: str = "balanced_binary") -> Tensor:
    return tree_max(tree_max(blocked(x, block, float("-inf")), block_tree), tree)
