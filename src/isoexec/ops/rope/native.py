"""The ordinary path, as Hugging Face models compute RoPE: an fp32 table on the device from fp32
inverse frequencies, cast to the activation dtype, applied in that dtype."""

import torch
from torch import Tensor

from ..common import expect_dtype


def rope(x: Tensor, positions: Tensor, theta: float, max_positions: int, rotary_dim: int | None = None, *, input_dtype: str, output_dtype: str) -> Tensor:
    expect_dtype(x, input_dtype, "rope input")
    head_dim = x.shape[-1]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=x.device, dtype=torch.int64).float() / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)
    cos, sin = angles.cos().to(x.dtype)[:, None, :], angles.sin().to(x.dtype)[:, None, :]
    rot = x[..., :rotary_dim]
    half = rotary_dim // 2
    rotate_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    y = torch.cat([rot * cos + rotate_half * sin, x[..., rotary_dim:]], dim=-1)
    expect_dtype(y, output_dtype, "rope output")
    return y
