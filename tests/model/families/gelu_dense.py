"""A test family from outside the package: a dense decoder whose feed-forward is a plain GELU MLP,
down(gelu_tanh(up(x))) as GPT-2 and Phi write it.

It is added the way any family is — a feed-forward spec and layer (`model.layers.register_ffn`), an op
region with its impls and probe (`contract.vocabulary.register_region`, `runtime.REGISTRY`), a family
(`model.families.register_family`) — and touches nothing of the engine, trainer, audit or RL loop.
Importing this module registers all of it once.
"""

import copy
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from conftest import preset_dict
from isoexec.contract import Contract, vocabulary
from isoexec.model import LayerSpec, ModelSpec, current_step, register_family
from isoexec.model.families import FAMILIES, Family
from isoexec.model.families.dense import dense_spec
from isoexec.model.layers import FFNS, Linear, register_ffn
from isoexec.model.spec import check_positive_ints
from isoexec.ops.common import ALL_CASES, expect_dtype, torch_dtype
from isoexec.runtime.registry import REGISTRY, Impl
from isoexec.validate.battery import hazard_rows, rowwise

ARCHITECTURE = "GeluDenseForCausalLM"
REGION = "activation.gelu"
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# The op: gelu_tanh(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))), elementwise in the compute
# dtype with one rounding. tanh is written from exp, as activation.reference writes silu: torch's exp
# gives an element the same bits whatever the tensor's size.
def gelu_reference(x, *, input_dtype: str, output_dtype: str, compute_dtype: str):
    expect_dtype(x, input_dtype, "gelu input")
    u = x.to(torch_dtype(compute_dtype))
    z = SQRT_2_OVER_PI * (u + 0.044715 * u * u * u)
    tanh = 1.0 - 2.0 / ((2.0 * z).exp() + 1.0)
    return (0.5 * u * (1.0 + tanh)).to(torch_dtype(output_dtype))


def gelu_native(x, *, input_dtype: str, output_dtype: str, compute_dtype: str):
    return F.gelu(x.to(torch_dtype(compute_dtype)), approximate="tanh").to(torch_dtype(output_dtype))


def gelu_probe(ctx):
    yield from rowwise(ctx, [torch.cat([ctx.randn(40, 40, scale=4.0), hazard_rows(ctx, 40)])])


@dataclass(frozen=True, kw_only=True)
class GeluMLPSpec:
    kind: ClassVar[str] = "gelu_mlp"
    intermediate_size: int

    def __post_init__(self):
        check_positive_ints(self)

    @property
    def ops(self):
        return frozenset({"up_proj", "down_proj", "gelu"})

    def projections(self, hidden_size: int):
        return {"up_proj": (self.intermediate_size, hidden_size), "down_proj": (hidden_size, self.intermediate_size)}

    def norm_widths(self):
        return {}

    def state(self):
        return None


class GeluMLP(nn.Module):
    name = "mlp"

    def __init__(self, spec: GeluMLPSpec, layer: int, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.up_proj = Linear(hidden_size, spec.intermediate_size, False, dtype)
        self.down_proj = Linear(spec.intermediate_size, hidden_size, False, dtype)

    def forward(self, x):
        ops = current_step().ops
        return ops["down_proj"](ops["gelu"](ops["up_proj"](x, self.up_proj.weight)), self.down_proj.weight)


def gelu_spec(base: ModelSpec) -> ModelSpec:
    """`base` (a dense spec) with every feed-forward a GELU MLP of the same width."""
    layers = tuple(LayerSpec(layer.mixer, GeluMLPSpec(intermediate_size=layer.ffn.intermediate_size)) for layer in base.layers)
    return base.replace(family="gelu-dense", architecture=ARCHITECTURE, layers=layers)


def from_config(config: dict, source: str) -> ModelSpec:
    return gelu_spec(dense_spec(**{**{k: config[k] for k in DENSE_FIELDS}, "architecture": "Qwen3ForCausalLM"}))


def to_hf_config(spec: ModelSpec) -> dict:
    attention = spec.layers[0].mixer
    return {"architectures": [ARCHITECTURE], "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
            "intermediate_size": spec.layers[0].ffn.intermediate_size, "num_hidden_layers": spec.num_hidden_layers,
            "num_attention_heads": attention.num_heads, "num_key_value_heads": attention.num_kv_heads, "head_dim": attention.head_dim,
            "rms_norm_eps": spec.rms_norm_eps, "rope_theta": attention.rope_theta, "max_position_embeddings": spec.max_position_embeddings,
            "tie_word_embeddings": spec.tie_word_embeddings, "dtype": spec.dtype}


DENSE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings", "dtype")


def contract_dict(base: dict) -> dict:
    """A dense contract's dict with the GELU pinned as its SwiGLU is (same impl kind, same constants)."""
    data = copy.deepcopy(base)
    activation = next(e for e in data["composition"] if e["region"] == "activation")
    kind = "native" if activation["impl"]["id"].endswith(".native") else "reference"
    data["composition"].append({**copy.deepcopy(activation), "region": REGION, "ops": ["gelu"],
                                "impl": {"id": f"{REGION}.{kind}", "version": 1}})
    data["name"] = f"{data['name']}-gelu"
    return data


def contract(preset: str = "tiny-dense") -> Contract:
    return Contract.from_dict(contract_dict(preset_dict(preset)))


def register() -> None:
    if "gelu-dense" in FAMILIES:
        return
    vocabulary.register_region(REGION)
    REGISTRY.register(Impl(id=f"{REGION}.reference", version=1, region=REGION, cases=ALL_CASES, fn=gelu_reference))
    REGISTRY.register(Impl(id=f"{REGION}.native", version=1, region=REGION, cases=ALL_CASES, fn=gelu_native))
    REGISTRY.register_probe(REGION, gelu_probe)
    if GeluMLPSpec.kind not in FFNS:
        register_ffn(GeluMLPSpec.kind, GeluMLP)
    register_family(Family(name="gelu-dense", architectures=(ARCHITECTURE,), from_config=from_config, to_hf_config=to_hf_config,
                           contract="tiny-dense"))


register()
