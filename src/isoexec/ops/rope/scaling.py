"""Frequency scaling of the rotary embedding: YaRN (https://arxiv.org/abs/2309.00071), as Hugging Face
transformers computes it for `rope_type = "yarn"` (DeepSeek-V3, GLM-4.x MoE lite, Qwen long-context).

YaRN keeps the fast-rotating dims as they are (extrapolation), divides the slow ones' frequencies by
`factor` (interpolation) and ramps linearly between the two over the dims where a dim completes between
`beta_slow` and `beta_fast` rotations in `original_max_position_embeddings` positions; cos and sin are
then multiplied by an attention factor. `inv_freq` is written once, in transformers' order of operations:
the reference's table takes it in float64 on the CPU, `native` in float32 on the device, as transformers
computes it.

`mscale` and `mscale_all_dim` of 0 mean unset, as a missing key (None) does in transformers.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

ROPE_TYPES = ("default", "yarn")


@dataclass(frozen=True)
class Yarn:
    """YaRN's parameters, the fields of a Hugging Face rope dict of that name. `factor`: how much longer the
    context is than `original_max_position_embeddings`, the pretraining length; `beta_fast`, `beta_slow`:
    the rotation counts bounding the ramp; `mscale`, `mscale_all_dim`: the attention factor's terms (0:
    unset); `attention_factor`: given outright instead; `truncate`: round the ramp's ends to whole dims."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        for name in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Yarn.{name} must be > 0, got {getattr(self, name)!r}")
        if not isinstance(self.original_max_position_embeddings, int):
            raise ValueError(f"Yarn.original_max_position_embeddings must be an int, got {self.original_max_position_embeddings!r}")
        if self.attention_factor is not None and not self.attention_factor > 0:
            raise ValueError(f"Yarn.attention_factor must be > 0, got {self.attention_factor!r}")


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def attention_factor(scaling: Yarn | None) -> float:
    """What cos and sin are multiplied by (1.0 without scaling)."""
    if scaling is None:
        return 1.0
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)
    if scaling.mscale and scaling.mscale_all_dim:
        return float(get_mscale(scaling.factor, scaling.mscale) / get_mscale(scaling.factor, scaling.mscale_all_dim))
    return get_mscale(scaling.factor)


def softmax_mscale(scaling: Yarn | None) -> float:
    """What DeepSeek-V3 and GLM-4 MoE lite multiply the attention softmax scale by: get_mscale(factor,
    mscale_all_dim)² where mscale_all_dim is set, else 1.0. (transformers' `yarn_apply_mscale` multiplies
    the scale by get_mscale twice, which can differ from one multiplication by this in the last bit.)"""
    if scaling is None or not scaling.mscale_all_dim:
        return 1.0
    mscale = get_mscale(scaling.factor, scaling.mscale_all_dim)
    return mscale * mscale


def correction_range(theta: float, rotary_dim: int, scaling: Yarn) -> tuple[float, float]:
    """The dims [low, high] over which the ramp runs from extrapolation to interpolation."""
    def dim_of(num_rotations: float) -> float:
        wavelengths = scaling.original_max_position_embeddings / (num_rotations * 2 * math.pi)
        return (rotary_dim * math.log(wavelengths)) / (2 * math.log(theta))

    low, high = dim_of(scaling.beta_fast), dim_of(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)


def inv_freq(theta: float, rotary_dim: int, scaling: Yarn | None, dtype: torch.dtype = torch.float64, device="cpu") -> Tensor:
    """[rotary_dim / 2] inverse frequencies theta^(-2i / rotary_dim), YaRN-scaled, in transformers' order of
    operations: in float64 on the CPU for the reference's table, in float32 on the device for `native`
    (transformers' own numerics)."""
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    pos_freqs = theta ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.int64).to(dtype) / rotary_dim)
    if scaling is None:
        return 1.0 / pos_freqs
    low, high = correction_range(theta, rotary_dim, scaling)
    if low == high:
        high += 0.001  # the ramp's width would be 0
    ramp = ((torch.arange(rotary_dim // 2, device=device, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (scaling.factor * pos_freqs)
    weight = 1 - ramp  # of extrapolation; 1 - weight is not always ramp's bits, and transformers computes it
    return interpolated * (1 - weight) + extrapolated * weight


def yarn_from_config(rope_parameters: dict | None, source: str) -> Yarn | None:
    """The scaling a Hugging Face rope dict asks for: transformers 5's `rope_parameters` ({rope_type,
    rope_theta, factor, ...}) or the older `rope_scaling` ({type or rope_type, ...}); None for the default
    rope. Missing optional keys (and None, and 0 for beta_fast and beta_slow) read as transformers reads
    them. `source` is how error messages name the dict, e.g. "rope_parameters"."""
    rope = rope_parameters or {}
    key = "rope_type" if "rope_type" in rope else "type"
    rope_type = rope.get(key) or "default"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{source}.{key}: {rope_type!r} is not supported ({', '.join(ROPE_TYPES)})")
    if rope_type == "default":
        return None
    missing = [name for name in ("factor", "original_max_position_embeddings") if rope.get(name) is None]
    if missing:
        raise ValueError(f"{source}: rope type 'yarn' needs {' and '.join(missing)}")

    def number(name: str, kind=float, default=None):
        value = rope.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{source}.{name}: {value!r} is not {'an int' if kind is int else 'a number'}")
        return kind(value or default or 0)  # transformers reads beta_fast and beta_slow of 0 as unset too

    fields = dict(factor=number("factor"), original_max_position_embeddings=number("original_max_position_embeddings", int),
                  beta_fast=number("beta_fast", default=32.0), beta_slow=number("beta_slow", default=1.0),
                  mscale=number("mscale", default=0.0), mscale_all_dim=number("mscale_all_dim", default=0.0),
                  attention_factor=number("attention_factor"), truncate=bool(rope.get("truncate", True)))
    try:
        return Yarn(**fields)
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None
