"""Batch-invariant RMSNorm: y = x / sqrt(mean(x²) + eps) * w, or * (1 + w) for zero-centred weights.

Per row, in the accumulation dtype: squares; their sum over the hidden dim in blocks of
`reduce_block` (`block_tree` inside a block, `tree` across blocks); divided by the hidden size; eps
added; square root and reciprocal (both correctly rounded); x times that, times the weight; one
rounding to the output dtype. The row never meets another row.

`rms_norm_residual` is the norm after a residual add: s = x + residual as `residual.reference.add`
computes it (with `accum_dtype` as its compute dtype), then y = rms_norm(s); it returns (y, s).
"""

from torch import Tensor

from ..common import expect_dtype, torch_dtype
from ..reduce import blocked_sum
from ..residual import reference as residual_reference


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


def rms_norm_residual(x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, zero_centered: bool = False, *,
                      input_dtype: str, output_dtype: str, accum_dtype: str, reduce_block: int, block_tree: str,
                      tree: str) -> tuple[Tensor, Tensor]:
    """x, residual [..., H] (None: nothing to add yet, s is x itself), weight [H] -> (y, s) [..., H]."""
    norm = dict(output_dtype=output_dtype, accum_dtype=accum_dtype, reduce_block=reduce_block, block_tree=block_tree, tree=tree)
    if residual is None:
        return rms_norm(x, weight, eps, zero_centered, input_dtype=input_dtype, **norm), x
    s = residual_reference.add(x, residual, input_dtype=input_dtype, output_dtype=output_dtype, compute_dtype=accum_dtype)
    return rms_norm(s, weight, eps, zero_centered, input_dtype=output_dtype, **norm), s
