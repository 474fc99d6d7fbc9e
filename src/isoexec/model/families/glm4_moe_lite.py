"""The GLM-4.7-Flash family (`Glm4MoeLiteForCausalLM`, model_type `glm4_moe_lite`): DeepSeek-V3's model
(`deepseek_v3.py`) with each layer's feed-forward named by `mlp_layer_types` ("dense" or "sparse"; by
default the first dense, the rest sparse) instead of `first_k_dense_replace`."""

from ..spec import ModelSpec, SpecError
from . import deepseek_v3
from .family import Family
from .qwen3_moe import fuse_experts

ARCHITECTURE = "Glm4MoeLiteForCausalLM"


def from_config(config: dict, source: str) -> ModelSpec:
    layers = deepseek_v3.layer_count(config, source)
    types = config.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if not isinstance(types, list) or len(types) != layers or any(t not in ("dense", "sparse") for t in types):
        raise SpecError(f"{source}: mlp_layer_types must list \"dense\" or \"sparse\" for each of the {layers} layers, got {types!r}")
    extra = (("mlp_layer_types", tuple(types)), *deepseek_v3.common_extra(config, source))
    return deepseek_v3.mla_moe_spec(config, source, family="glm4-moe-lite", architecture=ARCHITECTURE,
                                    sparse=[t == "sparse" for t in types], extra=extra)


def to_hf_config(spec: ModelSpec) -> dict:
    config = deepseek_v3.common_hf_config(spec, "glm4_moe_lite")
    config["mlp_layer_types"] = list(dict(spec.extra)["mlp_layer_types"])
    return config


def _preset(source: str, **changes) -> ModelSpec:
    config = deepseek_v3.tiny_config(architectures=[ARCHITECTURE], **changes)
    config.pop("first_k_dense_replace")
    return from_config(config, source)


FAMILY = Family(
    name="glm4-moe-lite",
    architectures=(ARCHITECTURE,),
    from_config=from_config,
    to_hf_config=to_hf_config,
    ignored_prefixes=deepseek_v3.mtp_prefixes,
    adapt=fuse_experts,
    contract="tiny-mla",
    presets={
        # Three layers (the first dense), six experts, top-2, one shared expert: fast on a CPU.
        "tiny-mla": _preset("the tiny-mla preset", n_routed_experts=6, n_group=1, topk_group=1, routed_scaling_factor=1.8),
        # GLM-4.7-Flash's layer shape (hidden 2048, 20 heads, q_lora_rank 768, kv_lora_rank 512, nope 192 + rope 64,
        # v 256, 64 experts of 1536, top-4, one shared expert) with random weights and 4 layers, for the GPU.
        "glm-4.7-flash-4l-random": _preset(
            "the glm-4.7-flash-4l-random preset", vocab_size=154_880, hidden_size=2048, intermediate_size=10_240, num_hidden_layers=4,
            num_attention_heads=20, num_key_value_heads=20, q_lora_rank=768, kv_lora_rank=512, qk_nope_head_dim=192,
            qk_rope_head_dim=64, v_head_dim=256, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            rms_norm_eps=1e-5, max_position_embeddings=202_752, n_routed_experts=64, num_experts_per_tok=4,
            moe_intermediate_size=1536, n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=1.8),
    },
)
