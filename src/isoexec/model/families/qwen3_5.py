"""The Qwen3.5 family (`Qwen3_5ForCausalLM`, text model_type `qwen3_5_text`): hybrid layers, Gated DeltaNet
(`gdn`) where `layer_types` says "linear_attention" and gated full attention (`gqa` with an output gate,
zero-centred q/k norms and rotary positions on `partial_rotary_factor` of each head) where it says
"full_attention"; a SwiGLU `mlp` in every layer; every RMSNorm but the gated one zero-centred (1 + w).

A full `Qwen3_5ForConditionalGeneration` checkpoint (model_type `qwen3_5`) is read for its language model:
the spec from `text_config`, the weights under `model.language_model.`; the vision tower
(`model.visual.`) and multi-token-prediction weights (`mtp.`) are ignored with one logged line.
"""

from ..spec import AttentionSpec, GDNSpec, LayerSpec, MLPSpec, ModelSpec, SpecError
from .family import Family, config_reader

ARCHITECTURE = "Qwen3_5ForCausalLM"
MULTIMODAL = "Qwen3_5ForConditionalGeneration"
LAYER_TYPES = ("linear_attention", "full_attention")
LANGUAGE_MODEL = "model.language_model."


def text_config(config: dict, source: str, multimodal: str = MULTIMODAL) -> dict:
    """The language model's config: `config` itself, or a multimodal checkpoint's `text_config`."""
    if config["architectures"][0] != multimodal:
        return config
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise SpecError(f"{source}: {multimodal} without a text_config")
    return {**text, "architectures": [multimodal], "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))}


def hybrid_layers(config: dict, source: str, ffn_of) -> tuple[LayerSpec, ...]:
    """One LayerSpec per entry of `layer_types` (or every 4th layer full attention, transformers' default);
    `ffn_of(i)` gives layer i's feed-forward."""
    get = config_reader(config, source)
    num_layers = get("num_hidden_layers")
    interval = config.get("full_attention_interval", 4)
    types = config.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers or any(t not in LAYER_TYPES for t in types):
        raise SpecError(f"{source}: layer_types must list {num_layers} of {', '.join(LAYER_TYPES)}, got {types!r}")
    rope = config.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise SpecError(f"{source}: rope_parameters must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise SpecError(f"{source}: rope type {rope_type!r} is not supported (only the default rotary embedding)")
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
    if config.get("attention_bias"):
        raise SpecError(f"{source}: attention_bias is not supported for {config['architectures'][0]}")
    if config.get("hidden_act", "silu") != "silu":
        raise SpecError(f"{source}: hidden_act {config.get('hidden_act')!r} is not supported (only silu)")
    heads = get("num_attention_heads")
    head_dim = config.get("head_dim") or get("hidden_size") // heads
    rotary_dim = int(head_dim * factor)
    attention = AttentionSpec(num_heads=heads, num_kv_heads=config.get("num_key_value_heads") or heads, head_dim=head_dim,
                              rope_theta=float(theta), qk_norm=True, zero_centered_qk_norm=True, output_gate=True,
                              rotary_dim=None if rotary_dim == head_dim else rotary_dim)
    gdn = GDNSpec(num_k_heads=get("linear_num_key_heads"), num_v_heads=get("linear_num_value_heads"), k_head_dim=get("linear_key_head_dim"),
                  v_head_dim=get("linear_value_head_dim"), conv_kernel=get("linear_conv_kernel_dim"))
    return tuple(LayerSpec(gdn if kind == "linear_attention" else attention, ffn_of(i)) for i, kind in enumerate(types))


def hybrid_spec(config: dict, source: str, family: str, architecture: str, layers: tuple[LayerSpec, ...],
                multimodal: str = MULTIMODAL) -> ModelSpec:
    get = config_reader(config, source)
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    eos = config.get("eos_token_id")
    extra = (("multimodal", config["architectures"][0] == multimodal),)
    return ModelSpec(family=family, architecture=architecture, vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), layers=layers,
                     rms_norm_eps=float(get("rms_norm_eps", 1e-6)), max_position_embeddings=get("max_position_embeddings"),
                     tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), dtype=dtype if dtype in ("float32", "bfloat16") else "bfloat16",
                     eos_token_id=eos[0] if isinstance(eos, list) and eos else eos, zero_centered_norms=True, extra=extra)


def from_config(config: dict, source: str) -> ModelSpec:
    config = text_config(config, source)
    intermediate = config_reader(config, source)("intermediate_size")
    layers = hybrid_layers(config, source, lambda i: MLPSpec(intermediate_size=intermediate))
    return hybrid_spec(config, source, "qwen3.5", ARCHITECTURE, layers)


def hybrid_fields(spec: ModelSpec, model_type: str) -> dict:
    """The config.json fields of a hybrid spec's layers (the attention and GDN shapes, layer_types)."""
    attention = next(layer.mixer for layer in spec.layers if isinstance(layer.mixer, AttentionSpec))
    gdn = next(layer.mixer for layer in spec.layers if isinstance(layer.mixer, GDNSpec))
    rotary = attention.rotary_dim or attention.head_dim
    return {
        "model_type": model_type, "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": attention.num_heads, "num_key_value_heads": attention.num_kv_heads, "head_dim": attention.head_dim,
        "rms_norm_eps": spec.rms_norm_eps, "max_position_embeddings": spec.max_position_embeddings, "tie_word_embeddings": spec.tie_word_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": attention.rope_theta, "partial_rotary_factor": rotary / attention.head_dim},
        "linear_num_key_heads": gdn.num_k_heads, "linear_num_value_heads": gdn.num_v_heads, "linear_key_head_dim": gdn.k_head_dim,
        "linear_value_head_dim": gdn.v_head_dim, "linear_conv_kernel_dim": gdn.conv_kernel,
        "layer_types": ["linear_attention" if isinstance(layer.mixer, GDNSpec) else "full_attention" for layer in spec.layers],
        "hidden_act": "silu", "attention_bias": False, "torch_dtype": spec.dtype,
        **({"eos_token_id": spec.eos_token_id} if spec.eos_token_id is not None else {}),
    }


def to_hf_config(spec: ModelSpec) -> dict:
    """Always the text model's config (`Qwen3_5ForCausalLM`); `save` writes the weights under its names."""
    return {"architectures": [ARCHITECTURE], **hybrid_fields(spec, "qwen3_5_text"), "intermediate_size": spec.layers[0].ffn.intermediate_size}


def language_model(tensors: dict, spec: ModelSpec) -> dict:
    """A multimodal checkpoint's language-model weights under the text model's names."""
    return {("model." + k[len(LANGUAGE_MODEL):] if k.startswith(LANGUAGE_MODEL) else k): v for k, v in tensors.items()}


def ignored(spec: ModelSpec) -> tuple[str, ...]:
    return ("model.visual.", "mtp.") if dict(spec.extra).get("multimodal") else ("mtp.",)


TINY_CONFIG = dict(architectures=[ARCHITECTURE], vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=2048,
                   tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                   layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])


def _tiny(**changes) -> ModelSpec:
    return from_config({**TINY_CONFIG, **changes}, "preset")


FAMILY = Family(
    name="qwen3.5",
    architectures=(ARCHITECTURE, MULTIMODAL),
    from_config=from_config,
    to_hf_config=to_hf_config,
    ignored_prefixes=ignored,
    adapt=language_model,
    contract="tiny-hybrid",
    presets={
        # Four layers (three Gated DeltaNet, one gated full attention), 4 value heads on 2 key heads: fast on a CPU.
        "tiny-hybrid": _tiny(),
        # Qwen3.5-9B's layer shapes (transformers' Qwen3_5TextConfig defaults: hidden 4096, 16 heads / 4 KV heads of
        # 256, rotary on a quarter, GDN 16 key / 32 value heads of 128, MLP 12288, vocabulary 248,320) with random
        # weights and 4 layers (3 GDN, 1 full attention), for the GPU.
        "qwen3.5-9b-4l-random": _tiny(vocab_size=248_320, hidden_size=4096, intermediate_size=12_288, num_attention_heads=16,
                                      num_key_value_heads=4, head_dim=256, max_position_embeddings=32_768, tie_word_embeddings=False,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
                                      linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128),
    },
)
