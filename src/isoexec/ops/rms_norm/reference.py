"""Batch-invariant RMSNorm: y = x / sqrt(mean(x²) + eps) * w, or * (1 + w) for zero-centred weights.

Per row, in the accumulation dtype: squares; their sum over the hidden dim in blocks of
`reduce_block` (`block_tree` inside a block, `tree` across blocks); divided by the hidden size; eps
added; square root and reciprocal (both correctly rounded); x times that, times the weight; one
rounding to the output dtype. The row never meets another row.
"""

from torch import Tensor

from ..common import expect_dtype, torch_dtype
from ..reduce import blocked_sum


def rms_norm(x: Tensor, weight: Tensor, eps: float, zero_centered: bool = False, *, input_dtype: str, output_dtype: str,
             accum_dtype: str, reduce_block: int, block_tree: str, tree: str) -> Tensor:
    """x [..., H], weight [H] -> [..., H]."""
    expect_dtype(x, input_dtype, "rms_norm input")
    accum = torch_dtype(accum_dtype)
    xf = x.to(accum)
    mean_square = blocked_sum(xf * xf, reduce_block, block_tree, tree) / x.shape[-1]  # [...]
    inverse = 1.0 / (mean_square + eps).sqrt()
    scale = weight.to(accum)
    if zero_centered:
        scale = 1.0 + scale
    return ((xf * inverse.unsqueeze(-1)) * scale).to(torch_dtype(output_dtype))
