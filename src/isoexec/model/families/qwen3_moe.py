"""The Qwen3-MoE family (`Qwen3MoeForCausalLM`): Qwen3 attention in every layer; a `moe` feed-forward
(softmax router, top-k, `norm_topk_prob`) in layer i unless i is in `mlp_only_layers` or
(i + 1) % `decoder_sparse_step` != 0, where a dense SwiGLU `mlp` of `intermediate_size` runs.

Checkpoints come in two expert layouts: transformers 5's fused `mlp.experts.gate_up_proj` [E, 2I, H] /
`mlp.experts.down_proj` [E, H, I] (the modules' own), and the older per-expert
`mlp.experts.{e}.{gate,up,down}_proj.weight`, stacked into the fused one on load.
"""

import re

import torch

from ..spec import LayerSpec, MLPSpec, MoESpec, ModelSpec, SpecError
from . import dense
from .family import Family, config_reader

ARCHITECTURE = "Qwen3MoeForCausalLM"
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")
PER_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def moe_spec(base: ModelSpec, *, num_experts: int, num_experts_per_tok: int, moe_intermediate_size: int, norm_topk_prob: bool = True,
             decoder_sparse_step: int = 1, mlp_only_layers: tuple[int, ...] = ()) -> ModelSpec:
    """`base` (a Qwen3 dense spec, whose MLP width is `intermediate_size`) with its MoE layers."""
    if not isinstance(decoder_sparse_step, int) or decoder_sparse_step < 1:
        raise SpecError(f"decoder_sparse_step: expected a positive int, got {decoder_sparse_step!r}")
    moe = MoESpec(num_experts=num_experts, top_k=num_experts_per_tok, moe_intermediate_size=moe_intermediate_size,
                  norm_topk_prob=bool(norm_topk_prob))
    layers = tuple(LayerSpec(layer.mixer, moe if i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0 else layer.ffn)
                   for i, layer in enumerate(base.layers))
    extra = (("decoder_sparse_step", decoder_sparse_step), ("mlp_only_layers", tuple(mlp_only_layers)),
             ("intermediate_size", base.layers[0].ffn.intermediate_size))
    return base.replace(family="qwen3-moe", architecture=ARCHITECTURE, layers=layers, extra=extra)


def from_config(config: dict, source: str) -> ModelSpec:
    get = config_reader(config, source)
    fields = {name: get(name) for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")}
    if config.get("scoring_func", "softmax") != "softmax":
        raise SpecError(f"{source}: scoring_func {config['scoring_func']!r} is not Qwen3-MoE's (softmax)")
    mlp_only = config.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise SpecError(f"{source}: mlp_only_layers must be a list of layer indices, got {mlp_only!r}")
    dense_config = {**config, "architectures": ["Qwen3ForCausalLM"], "intermediate_size": config.get("intermediate_size") or get("moe_intermediate_size")}
    base = dense.from_config(dense_config, source)
    return moe_spec(base, **fields, norm_topk_prob=config.get("norm_topk_prob", False),
                    decoder_sparse_step=config.get("decoder_sparse_step", 1), mlp_only_layers=tuple(mlp_only))


def to_hf_config(spec: ModelSpec) -> dict:
    extra = dict(spec.extra)
    moe = next(layer.ffn for layer in spec.layers if isinstance(layer.ffn, MoESpec))
    first = spec.layers[0]
    base = LayerSpec(first.mixer, MLPSpec(intermediate_size=extra["intermediate_size"]))
    config = dense.to_hf_config(spec.replace(family="dense", architecture="Qwen3ForCausalLM", layers=(base,) * spec.num_hidden_layers, extra=()))
    config.update(architectures=[ARCHITECTURE], model_type="qwen3_moe", num_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                  moe_intermediate_size=moe.moe_intermediate_size, norm_topk_prob=moe.norm_topk_prob,
                  decoder_sparse_step=extra["decoder_sparse_step"], mlp_only_layers=list(extra["mlp_only_layers"]))
    return config


def fuse_experts(tensors: dict, spec: ModelSpec) -> dict:
    """The per-expert layout stacked into the fused one; a layer with some experts missing is left for
    the loader to name what is missing."""
    per_expert, out = {}, {}
    for key, tensor in tensors.items():
        match = PER_EXPERT.match(key)
        if match:
            per_expert.setdefault(match.group(1), {}).setdefault(int(match.group(2)), {})[match.group(3)] = tensor
        else:
            out[key] = tensor
    for prefix, experts in per_expert.items():
        count = max(experts) + 1
        if sorted(experts) != list(range(count)) or any(set(parts) != {"gate", "up", "down"} for parts in experts.values()):
            missing = [f"{prefix}.{e}.{p}_proj.weight" for e in range(count) for p in ("gate", "up", "down") if p not in experts.get(e, {})]
            raise SpecError(f"checkpoint: expert weights incomplete, missing {missing[:5]}")
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([experts[e]["gate"], experts[e]["up"]]) for e in range(count)])
        out[f"{prefix}.down_proj"] = torch.stack([experts[e]["down"] for e in range(count)])
    return out


def _tiny(**changes) -> ModelSpec:
    fields = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                  mlp_only_layers=(0,))
    moe = {k: changes.pop(k) for k in list(changes) if k in fields}
    base = dense.dense_spec(**{**dense.dense_fields(dense.FAMILY.presets["tiny-dense"]), "num_hidden_layers": 3, **changes})
    return moe_spec(base, **{**fields, **moe})


FAMILY = Family(
    name="qwen3-moe",
    architectures=(ARCHITECTURE,),
    from_config=from_config,
    to_hf_config=to_hf_config,
    adapt=fuse_experts,
    contract="tiny-moe",
    presets={
        # Three layers (the first dense), six experts, top-2: fast on a CPU.
        "tiny-moe": _tiny(),
        # Qwen3-30B-A3B's layer shape (hidden 2048, 128 experts, top-8, moe_intermediate 768, 32 heads / 4 KV
        # heads of 128) with random weights and 4 layers, for the GPU.
        "qwen3-30b-a3b-4l-random": _tiny(vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=4,
                                         num_attention_heads=32, num_key_value_heads=4, head_dim=128, max_position_embeddings=40_960,
                                         num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, mlp_only_layers=()),
    },
)
