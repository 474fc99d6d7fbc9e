"""Batch-invariant full-vocabulary log-softmax: each row by one fixed sequence of IEEE operations.

Row r is computed as: x = logits[r] in the accumulation dtype; m = max(x) by `blocked_max` (vocab
blocks of `vocab_block`, `block_tree` inside a block, `leaf_tree` across blocks); shifted = x - m;
S = Σ exp(shifted) by `blocked_sum` over the same blocks and trees; out = shifted - log(S), rounded
once to the output dtype. The last block is padded inside the reductions only (-inf for the max, +0.0
for the sum), so any vocabulary size works. Nothing in that sequence depends on how many rows share
the call. A tensor-parallel rank holding whole blocks of the vocabulary runs the same sequence on its
blocks (`vocab_parallel`): the per-block maxima and sums are the leaves every rank gathers (bytes) and
folds by `leaf_tree`, so its entries are the whole row's bit for bit.

Rows that are not ordinary probability rows:
- -inf entries (masked vocabulary) give -inf and do not change the other entries' arithmetic;
- an all -inf row gives all -inf: its max is replaced by 0 and its sum (0) by 1 before the log, two
  selections that never happen in a row with a finite entry (whose shifted max contributes exp(0) = 1);
- a NaN or +inf anywhere makes that row all NaN, and only that row.

The backward pass is grad - softmax · Σ grad with ordinary ops: gradients must be correct, not
batch-invariant.
"""

from typing import Callable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..common import TILE_ELEMENTS, expect_dtype, torch_dtype
from ..reduce import blocked, tree_max, tree_sum


def _whole(leaves: Tensor) -> Tensor:
    return leaves


def log_softmax_rows(x: Tensor, *, vocab_block: int, block_tree: str, leaf_tree: str,
                     gather: Callable[[Tensor], Tensor] = _whole) -> Tensor:
    """Log-softmax of the last dim of `x`, in `x`'s dtype, by the fixed order above: [..., V] -> [..., V].

    The renormalisation every contract op shares (sampling uses it after top-k). With `gather`, `x` is a
    shard of the rows made of whole vocab blocks and gather([..., its blocks]) -> [..., every block] puts
    every shard's per-block leaves in block order: the result is the shard's part of the whole rows'."""
    # Detached: log-softmax does not depend on the shift, and the max's ties need no gradient.
    block_maxima = tree_max(blocked(x.detach(), vocab_block, float("-inf")), block_tree)  # [..., blocks]
    row_max = tree_max(gather(block_maxima), leaf_tree).unsqueeze(-1)  # [..., 1]
    is_empty = row_max == float("-inf")  # [..., 1] all entries -inf
    shifted = x - torch.where(is_empty, 0.0, row_max)  # [..., V]
    block_sums = tree_sum(blocked(torch.exp(shifted), vocab_block, 0.0), block_tree)  # [..., blocks]
    total = tree_sum(gather(block_sums), leaf_tree).unsqueeze(-1)  # [..., 1]
    return shifted - torch.log(torch.where(is_empty, 1.0, total))


def log_softmax_grad(ctx, grad: Tensor) -> Tensor:
    """grad - softmax · Σ grad from the saved log-probs, with ordinary ops (correct, not invariant)."""
    (out,) = ctx.saved_tensors
    dtype = torch.promote_types(out.dtype, torch.float32)
    g = grad.to(dtype)
    return (g - torch.exp(out.to(dtype)) * g.sum(-1, keepdim=True)).to(ctx.input_dtype)


class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, out_dtype, accum, vocab_block, block_tree, leaf_tree):
        rows = logits.reshape(-1, logits.shape[-1])  # [R, V]
        out = rows.new_empty(rows.shape, dtype=out_dtype)
        # Tiling over rows only: a row's arithmetic never sees its neighbours.
        tile = max(1, TILE_ELEMENTS // max(1, rows.shape[-1]))
        for r0 in range(0, rows.shape[0], tile):
            x = rows[r0 : r0 + tile].to(accum)
            out[r0 : r0 + tile] = log_softmax_rows(x, vocab_block=vocab_block, block_tree=block_tree, leaf_tree=leaf_tree)
        out = out.reshape(logits.shape)
        ctx.save_for_backward(out)
        ctx.input_dtype = logits.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return log_softmax_grad(ctx, grad), None, None, None, None, None


def logprobs(logits: Tensor, *, input_dtype: str, output_dtype: str, accum_dtype: str, vocab_block: int, block_tree: str,
             leaf_tree: str) -> Tensor:
    """Full-vocabulary log-probabilities: logits [..., V] -> [..., V] in the output dtype."""
    expect_dtype(logits, input_dtype, "logprobs input")
    return _LogSoftmax.apply(logits, torch_dtype(output_dtype), torch_dtype(accum_dtype), vocab_block, block_tree, leaf_tree)


def vocab_parallel(logits: Tensor, gather: Callable[[Tensor], Tensor], *, input_dtype: str, output_dtype: str, accum_dtype: str,
                   vocab_block: int, block_tree: str, leaf_tree: str) -> Tensor:
    """A tensor-parallel rank's part of `logprobs` (no autograd, no row tiling: `parallel/ops.py` adds both):
    logits [R, v] of the rank's whole vocab blocks -> [R, v] in the output dtype, `gather` as in `log_softmax_rows`."""
    expect_dtype(logits, input_dtype, "logprobs input")
    out = log_softmax_rows(logits.to(torch_dtype(accum_dtype)), vocab_block=vocab_block, block_tree=block_tree, leaf_tree=leaf_tree,
                           gather=gather)
    return out.to(torch_dtype(output_dtype))


def token_logprobs(full: Tensor, tokens: Tensor) -> Tensor:
    """The log-probability of each row's token: full [..., V], tokens [...] -> [...]; a gather, so exact."""
    return full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
