"""The DeepSeek-V3 family (`DeepseekV3ForCausalLM`): `mla` attention in every layer; a dense SwiGLU `mlp`
in the first `first_k_dense_replace` layers, then `moe` layers with DeepSeek's router (sigmoid scores,
`e_score_correction_bias` for selection, group-limited top-k over `n_group` groups keeping `topk_group`,
weights from the unbiased scores, renormalised, times `routed_scaling_factor`) and `n_shared_experts`
shared experts. The GLM-4.7-Flash family (`glm4_moe_lite.py`) is the same model with its layer types
listed instead (`mlp_layer_types`); both read their fields here.

Multi-token-prediction layers (`num_nextn_predict_layers`, stored as the layers after the last one)
draft tokens for speculative decoding; rollout and training of the main head never read them, so their
keys are ignored with one logged line. Expert weights load from the fused or the per-expert layout.
"""

from ...ops.rope.scaling import softmax_mscale, yarn_from_config
from ..spec import LayerSpec, MLASpec, MLPSpec, MoESpec, ModelSpec, SpecError
from .family import Family, config_reader
from .qwen3_moe import fuse_experts

ARCHITECTURE = "DeepseekV3ForCausalLM"


def rope_of(config: dict, source: str):
    """(theta, Yarn or None, the rope dict to write back) from transformers 5's `rope_parameters` or the
    older `rope_theta` + `rope_scaling`."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise SpecError(f"{source}: rope_parameters must be a mapping, got {rope!r}")
    theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
    try:
        scaling = yarn_from_config(rope, source)
    except ValueError as error:
        raise SpecError(str(error)) from None
    return float(theta), scaling, {**rope, "rope_theta": float(theta), "rope_type": rope.get("rope_type", rope.get("type", "default"))}


def mla_of(config: dict, source: str) -> MLASpec:
    get = config_reader(config, source)
    heads = get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    if kv_heads != heads:
        raise SpecError(f"{source}: num_key_value_heads {kv_heads} must equal num_attention_heads {heads} for multi-head latent attention")
    if "q_lora_rank" not in config:
        raise SpecError(f"{source}: missing q_lora_rank (null for a plain q_proj)")
    theta, scaling, _ = rope_of(config, source)
    nope, rope_dim = get("qk_nope_head_dim"), get("qk_rope_head_dim")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (nope, rope_dim)):
        raise SpecError(f"{source}: qk_nope_head_dim and qk_rope_head_dim must be positive ints, got {nope!r}, {rope_dim!r}")
    return MLASpec(num_heads=heads, q_lora_rank=config["q_lora_rank"], kv_lora_rank=get("kv_lora_rank"), qk_nope_head_dim=nope,
                   qk_rope_head_dim=rope_dim, v_head_dim=get("v_head_dim"), rope_theta=theta, rope_scaling=scaling,
                   scale=float((nope + rope_dim) ** -0.5 * softmax_mscale(scaling)), rope_interleave=bool(config.get("rope_interleave", True)),
                   attention_bias=bool(config.get("attention_bias", False)))


def moe_of(config: dict, source: str) -> MoESpec:
    get = config_reader(config, source)
    if config.get("scoring_func", "sigmoid") != "sigmoid":
        raise SpecError(f"{source}: scoring_func {config['scoring_func']!r} is not supported here (sigmoid)")
    if config.get("topk_method", "noaux_tc") != "noaux_tc":
        raise SpecError(f"{source}: topk_method {config['topk_method']!r} is not supported (noaux_tc)")
    shared = config.get("n_shared_experts") or 0
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise SpecError(f"{source}: n_shared_experts must be a non-negative int, got {shared!r}")
    width = get("moe_intermediate_size")
    return MoESpec(num_experts=get("n_routed_experts"), top_k=get("num_experts_per_tok"), moe_intermediate_size=width,
                   norm_topk_prob=bool(config.get("norm_topk_prob", True)), scoring="sigmoid", score_bias=True,
                   n_group=config.get("n_group") or 1, topk_group=config.get("topk_group") or 1,
                   routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
                   shared_intermediate_size=shared * width if shared else None)


def mla_moe_spec(config: dict, source: str, *, family: str, architecture: str, sparse: list[bool], extra: tuple) -> ModelSpec:
    """The model with layer i's feed-forward `moe` where sparse[i], else a dense `mlp` of intermediate_size."""
    get = config_reader(config, source)
    if config.get("hidden_act", "silu") != "silu":
        raise SpecError(f"{source}: hidden_act {config.get('hidden_act')!r} is not supported (only silu)")
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?") if isinstance(config["quantization_config"], dict) else "?"
        raise SpecError(f"{source}: quantization_config ({method}) is not supported: convert the checkpoint to bf16 first")
    mixer = mla_of(config, source)
    moe = moe_of(config, source) if any(sparse) else None
    dense = MLPSpec(intermediate_size=get("intermediate_size")) if not all(sparse) else None
    layers = tuple(LayerSpec(mixer, moe if s else dense) for s in sparse)
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    eos = config.get("eos_token_id")
    return ModelSpec(family=family, architecture=architecture, vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), layers=layers,
                     rms_norm_eps=float(get("rms_norm_eps", 1e-6)), max_position_embeddings=get("max_position_embeddings"),
                     tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                     dtype=dtype if dtype in ("float32", "bfloat16") else "bfloat16",
                     eos_token_id=eos[0] if isinstance(eos, list) and eos else eos, extra=extra)


def layer_count(config: dict, source: str) -> int:
    layers = config_reader(config, source)("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise SpecError(f"{source}: num_hidden_layers: expected a positive int, got {layers!r}")
    return layers


def common_extra(config: dict, source: str) -> tuple:
    """What writing config.json back needs beyond the spec: the dense width, the MTP layer count, the rope dict."""
    mtp = config.get("num_nextn_predict_layers", 0) or 0
    return (("intermediate_size", config.get("intermediate_size")), ("num_nextn_predict_layers", mtp),
            ("rope_parameters", rope_of(config, source)[2]))


def from_config(config: dict, source: str) -> ModelSpec:
    layers = layer_count(config, source)
    first_dense = config.get("first_k_dense_replace", 0) or 0
    if config.get("moe_layer_freq", 1) != 1:
        raise SpecError(f"{source}: moe_layer_freq {config['moe_layer_freq']!r} is not supported (1)")
    if not isinstance(first_dense, int) or isinstance(first_dense, bool) or not 0 <= first_dense <= layers:
        raise SpecError(f"{source}: first_k_dense_replace must be an int in 0..{layers}, got {first_dense!r}")
    extra = (("first_k_dense_replace", first_dense), *common_extra(config, source))
    return mla_moe_spec(config, source, family="deepseek-v3", architecture=ARCHITECTURE, sparse=[i >= first_dense for i in range(layers)],
                        extra=extra)


def common_hf_config(spec: ModelSpec, model_type: str) -> dict:
    extra = dict(spec.extra)
    mla = spec.mla[0]
    moe = next((layer.ffn for layer in spec.layers if isinstance(layer.ffn, MoESpec)), None)
    config = {
        "architectures": [spec.architecture], "model_type": model_type, "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": extra["intermediate_size"], "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": mla.num_heads, "num_key_value_heads": mla.num_heads, "q_lora_rank": mla.q_lora_rank,
        "kv_lora_rank": mla.kv_lora_rank, "qk_nope_head_dim": mla.qk_nope_head_dim, "qk_rope_head_dim": mla.qk_rope_head_dim,
        "v_head_dim": mla.v_head_dim, "rope_interleave": mla.rope_interleave, "attention_bias": mla.attention_bias,
        "rope_parameters": extra["rope_parameters"], "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": spec.tie_word_embeddings, "hidden_act": "silu",
        "torch_dtype": spec.dtype, "num_nextn_predict_layers": extra["num_nextn_predict_layers"],
    }
    if moe is not None:
        shared = (moe.shared_intermediate_size or 0) // moe.moe_intermediate_size
        config.update(n_routed_experts=moe.num_experts, num_experts_per_tok=moe.top_k, moe_intermediate_size=moe.moe_intermediate_size,
                      n_shared_experts=shared, norm_topk_prob=moe.norm_topk_prob, n_group=moe.n_group, topk_group=moe.topk_group,
                      routed_scaling_factor=moe.routed_scaling_factor)
    if spec.eos_token_id is not None:
        config["eos_token_id"] = spec.eos_token_id
    return config


def to_hf_config(spec: ModelSpec) -> dict:
    config = common_hf_config(spec, "deepseek_v3")
    config["first_k_dense_replace"] = dict(spec.extra)["first_k_dense_replace"]
    return config


def mtp_prefixes(spec: ModelSpec) -> tuple[str, ...]:
    count = dict(spec.extra).get("num_nextn_predict_layers", 0)
    return tuple(f"model.layers.{spec.num_hidden_layers + i}." for i in range(count))


def tiny_config(**changes) -> dict:
    """A small config in this family's fields (the tests' and presets' base)."""
    config = dict(architectures=[ARCHITECTURE], vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                  qk_rope_head_dim=8, v_head_dim=16, rope_interleave=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  rms_norm_eps=1e-6, max_position_embeddings=2048, tie_word_embeddings=False, torch_dtype="bfloat16",
                  n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, n_group=2, topk_group=1,
                  norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1)
    return {**config, **changes}


FAMILY = Family(
    name="deepseek-v3",
    architectures=(ARCHITECTURE,),
    from_config=from_config,
    to_hf_config=to_hf_config,
    ignored_prefixes=mtp_prefixes,
    adapt=fuse_experts,
    contract="tiny-mla",
    presets={
        # Three layers (the first dense), eight experts in two groups, top-2: fast on a CPU.
        "tiny-deepseek-v3": from_config(tiny_config(), "the tiny-deepseek-v3 preset"),
    },
)
