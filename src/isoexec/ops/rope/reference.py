"""Rotary position embedding from one cos/sin table indexed by absolute position.

The table is built once per (theta, rotary_dim, max_positions, scaling) on the CPU in float64 — every
entry elementwise from its own position, so it does not depend on the table's length or on the device —
from the (YaRN-scaled, `scaling.py`) inverse frequencies, multiplied by the scaling's attention factor and
rounded once to `table_dtype`. Applying it is elementwise in `compute_dtype` (the `rotate_half` layout of
Llama/Qwen: the first half of the rotary dims pairs with the second half), with one rounding.
Dims past `rotary_dim` pass through untouched (partial rotary).
"""

import functools

import torch
from torch import Tensor

from ..common import expect_dtype, torch_dtype
from . import scaling as rope_scaling
from .scaling import Yarn


@functools.lru_cache(maxsize=32)
def cos_sin_table(theta: float, rotary_dim: int, max_positions: int, table_dtype: str, device: str, scaling: Yarn | None = None) -> Tensor:
    """[max_positions, rotary_dim // 2, 2] holding attention_factor · (cos, sin) of position · inv_freq_i,
    inv_freq_i = theta^(-2i / rotary_dim) YaRN-scaled."""
    inv_freq = rope_scaling.inv_freq(theta, rotary_dim, scaling)  # [rotary_dim / 2]
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    table = torch.stack([angles.cos(), angles.sin()], dim=-1) * rope_scaling.attention_factor(scaling)
    return table.to(torch_dtype(table_dtype)).to(device)


def rope(x: Tensor, positions: Tensor, theta: float, max_positions: int, rotary_dim: int | None = None, scaling: Yarn | None = None, *,
         input_dtype: str, output_dtype: str, table_dtype: str, compute_dtype: str, table_build: str) -> Tensor:
    """x [T, H, D], positions [T] -> [T, H, D]."""
    expect_dtype(x, input_dtype, "rope input")
    if table_build != "cpu_float64":
        raise ValueError(f'rope.reference builds its table on the CPU in float64, not "{table_build}"')
    head_dim = x.shape[-1]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if not 0 < rotary_dim <= head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be in 1..{head_dim}")
    compute = torch_dtype(compute_dtype)
    table = cos_sin_table(float(theta), rotary_dim, max_positions, table_dtype, str(x.device), scaling)
    entry = table.index_select(0, positions.reshape(-1)).to(compute)  # [T, rotary_dim / 2, 2]
    cos, sin = entry[:, None, :, 0], entry[:, None, :, 1]  # [T, 1, rotary_dim / 2]
    half = rotary_dim // 2
    x1, x2 = x[..., :half].to(compute), x[..., half:rotary_dim].to(compute)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(torch_dtype(output_dtype))
    if rotary_dim == head_dim:
        return rotated
    return torch.cat([rotated, x[..., rotary_dim:].to(rotated.dtype)], dim=-1)


def check_constants(constants: dict) -> None:
    if constants["table_build"] != "cpu_float64":
        raise ValueError(f'table_build must be "cpu_float64", got "{constants["table_build"]}"')
