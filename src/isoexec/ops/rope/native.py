"""The ordinary path, as Hugging Face models compute RoPE: an fp32 table on the device from fp32
inverse frequencies (YaRN-scaled, cos and sin times its attention factor, in fp32), cast to the
activation dtype, applied in that dtype."""

import torch
from torch import Tensor

from ..common import expect_dtype
from . import scaling as rope_scaling
from .scaling import Yarn


def rope(x: Tensor, positions: Tensor, theta: float, max_positions: int, rotary_dim: int | None = None, scaling: Yarn | None = None, *,
         input_dtype: str, output_dtype: str) -> Tensor:
    expect_dtype(x, input_dtype, "rope input")
    head_dim = x.shape[-1]
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    inv_freq = rope_scaling.inv_freq(theta, rotary_dim, scaling, torch.float32, x.device)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([freqs, freqs], dim=-1)
    factor = rope_scaling.attention_factor(scaling)
    cos, sin = (angles.cos() * factor).to(x.dtype)[:, None, :], (angles.sin() * factor).to(x.dtype)[:, None, :]
    rot = x[..., :rotary_dim]
    half = rotary_dim // 2
    rotate_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    y = torch.cat([rot * cos + rotate_half * sin, x[..., rotary_dim:]], dim=-1)
    expect_dtype(y, output_dtype, "rope output")
    return y
