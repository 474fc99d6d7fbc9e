"""The Qwen3.5-MoE family (`Qwen3_5MoeForCausalLM`, text model_type `qwen3_5_moe_text`): Qwen3.5's hybrid
layers (`qwen3_5.py`) with a `moe` feed-forward in every layer — softmax router, top-k renormalised, and
one shared expert scaled by sigmoid(`shared_expert_gate`(x)) before the combine adds it.

A `Qwen3_5MoeForConditionalGeneration` checkpoint is read for its language model as Qwen3.5's is;
per-expert expert weights are stacked into the fused layout (`qwen3_moe.fuse_experts`).
"""

from ..spec import ModelSpec, MoESpec, SpecError
from . import qwen3_5, qwen3_moe
from .family import Family, config_reader

ARCHITECTURE = "Qwen3_5MoeForCausalLM"
MULTIMODAL = "Qwen3_5MoeForConditionalGeneration"


def from_config(config: dict, source: str) -> ModelSpec:
    config = qwen3_5.text_config(config, source, multimodal=MULTIMODAL)
    get = config_reader(config, source)
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        raise SpecError(f"{source}: dense layers among Qwen3.5-MoE's (mlp_only_layers, decoder_sparse_step) are not supported")
    moe = MoESpec(num_experts=get("num_experts"), top_k=get("num_experts_per_tok"), moe_intermediate_size=get("moe_intermediate_size"),
                  norm_topk_prob=True, shared_intermediate_size=get("shared_expert_intermediate_size"), shared_gate=True)
    layers = qwen3_5.hybrid_layers(config, source, lambda i: moe)
    return qwen3_5.hybrid_spec(config, source, "qwen3.5-moe", ARCHITECTURE, layers, multimodal=MULTIMODAL)


def to_hf_config(spec: ModelSpec) -> dict:
    moe = spec.layers[0].ffn
    return {"architectures": [ARCHITECTURE], **qwen3_5.hybrid_fields(spec, "qwen3_5_moe_text"), "num_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.moe_intermediate_size,
            "shared_expert_intermediate_size": moe.shared_intermediate_size}


def adapt(tensors: dict, spec: ModelSpec) -> dict:
    return qwen3_moe.fuse_experts(qwen3_5.language_model(tensors, spec), spec)


def _tiny(**changes) -> ModelSpec:
    config = {**qwen3_5.TINY_CONFIG, "architectures": [ARCHITECTURE], "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 48, **changes}
    config.pop("intermediate_size")
    return from_config(config, "preset")


# Qwen3.5-35B-A3B's layer shapes: hidden 2048, 16 heads / 2 KV heads of 256 (rotary on a quarter), GDN 16 key / 32
# value heads of 128, 256 experts of 512, top-8, a gated shared expert of 512, vocabulary 248,320.
A3B_SHAPES = dict(vocab_size=248_320, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256, max_position_embeddings=32_768,
                  tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
                  linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, num_experts=256,
                  num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512)

FAMILY = Family(
    name="qwen3.5-moe",
    architectures=(ARCHITECTURE, MULTIMODAL),
    from_config=from_config,
    to_hf_config=to_hf_config,
    ignored_prefixes=qwen3_5.ignored,
    adapt=adapt,
    contract="tiny-hybrid",
    presets={
        # tiny-hybrid's layers with six experts of 32, top-2, and a gated shared expert of 48 in each.
        "tiny-hybrid-moe": _tiny(),
        # Qwen3.5-35B-A3B's layer shapes with random weights and 4 layers (3 GDN, 1 full attention), for one GPU.
        "qwen3.5-35b-a3b-4l-random": _tiny(**A3B_SHAPES),
        # All of Qwen3.5-35B-A3B's 40 layers (every 4th full attention), random weights: issue 21's RL step on 8 GPUs.
        "qwen3.5-35b-a3b-random": _tiny(**A3B_SHAPES, num_hidden_layers=40, layer_types=None),
    },
)
