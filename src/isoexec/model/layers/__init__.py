"""The layers a decoder is built from, by the `kind` of each layer spec's mixer and feed-forward.

A mixer is built as `cls(spec, layer, hidden_size, eps, max_position, dtype)` and called as
`(x, positions) -> x`; a feed-forward as `cls(spec, layer, hidden_size, dtype)` and `(x) -> x`. Each
class names the attribute it lives under (`name`, the checkpoint's: `self_attn`, `mlp`). A new kind
registers its class here, or from outside with `register_mixer` / `register_ffn`.
"""

from .attention import Attention
from .gdn import GatedDeltaNet
from .mla import MLAttention
from .mlp import MLP
from .moe import MoE
from .params import Embedding, Linear, Norm

MIXERS: dict[str, type] = {"gqa": Attention, "mla": MLAttention, "gdn": GatedDeltaNet}
FFNS: dict[str, type] = {"mlp": MLP, "moe": MoE}


def register_mixer(kind: str, cls: type) -> None:
    if kind in MIXERS:
        raise ValueError(f"a mixer of kind {kind!r} is already registered")
    MIXERS[kind] = cls


def register_ffn(kind: str, cls: type) -> None:
    if kind in FFNS:
        raise ValueError(f"a feed-forward of kind {kind!r} is already registered")
    FFNS[kind] = cls


__all__ = ["FFNS", "MIXERS", "MLP", "Attention", "GatedDeltaNet", "MLAttention", "MoE", "Embedding", "Linear", "Norm", "register_ffn", "register_mixer"]
