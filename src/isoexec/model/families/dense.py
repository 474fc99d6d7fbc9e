"""The dense family: Qwen3, Qwen2, Llama and MiMo-7B, every layer `gqa` attention and a SwiGLU `mlp`.

MiMo (`MiMoForCausalLM`) is Qwen2 plus multi-token-prediction layers (`model.mtp_layers.*`) that
draft extra tokens; rollout and training of the main head never read them, so their keys are ignored.
"""

from ..spec import AttentionSpec, LayerSpec, MLPSpec, ModelSpec, SpecError
from .family import Family, config_reader

# architecture -> (model_type, q/k/v bias, o_proj bias, q/k RMSNorm)
ARCHITECTURES = {
    "Qwen3ForCausalLM": ("qwen3", False, False, True),
    "Qwen2ForCausalLM": ("qwen2", True, False, False),
    "LlamaForCausalLM": ("llama", False, False, False),
    "MiMoForCausalLM": ("mimo", True, False, False),
}
IGNORED_PREFIXES = {"MiMoForCausalLM": ("model.mtp_layers.",)}


def dense_spec(*, architecture: str, vocab_size: int, hidden_size: int, intermediate_size: int, num_hidden_layers: int,
               num_attention_heads: int, num_key_value_heads: int, head_dim: int, rms_norm_eps: float, rope_theta: float,
               max_position_embeddings: int, tie_word_embeddings: bool, dtype: str = "bfloat16", eos_token_id: int | None = None,
               extra: tuple = ()) -> ModelSpec:
    """A dense model from the fields of its config.json: every layer the same."""
    if architecture not in ARCHITECTURES:
        raise SpecError(f"architectures: {architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    for name, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("intermediate_size", intermediate_size),
                        ("num_hidden_layers", num_hidden_layers), ("num_attention_heads", num_attention_heads),
                        ("num_key_value_heads", num_key_value_heads), ("head_dim", head_dim),
                        ("max_position_embeddings", max_position_embeddings)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"{name}: expected a positive int, got {value!r}")
    _, qkv_bias, o_bias, qk_norm = ARCHITECTURES[architecture]
    attention = AttentionSpec(num_heads=num_attention_heads, num_kv_heads=num_key_value_heads, head_dim=head_dim,
                              rope_theta=rope_theta, qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qk_norm)
    layer = LayerSpec(attention, MLPSpec(intermediate_size=intermediate_size))
    return ModelSpec(family="dense", architecture=architecture, vocab_size=vocab_size, hidden_size=hidden_size,
                     layers=(layer,) * num_hidden_layers, rms_norm_eps=rms_norm_eps, max_position_embeddings=max_position_embeddings,
                     tie_word_embeddings=tie_word_embeddings, dtype=dtype, eos_token_id=eos_token_id, extra=tuple(extra))


def dense_fields(spec: ModelSpec) -> dict:
    """The keyword arguments of `dense_spec` that give `spec` back."""
    attention, mlp = spec.layers[0].mixer, spec.layers[0].ffn
    return dict(architecture=spec.architecture, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                intermediate_size=mlp.intermediate_size, num_hidden_layers=spec.num_hidden_layers, num_attention_heads=attention.num_heads,
                num_key_value_heads=attention.num_kv_heads, head_dim=attention.head_dim, rms_norm_eps=spec.rms_norm_eps,
                rope_theta=attention.rope_theta, max_position_embeddings=spec.max_position_embeddings,
                tie_word_embeddings=spec.tie_word_embeddings, dtype=spec.dtype, eos_token_id=spec.eos_token_id, extra=spec.extra)


def from_config(config: dict, source: str) -> ModelSpec:
    get = config_reader(config, source)
    architecture = config["architectures"][0]
    if architecture not in ARCHITECTURES:
        raise SpecError(f"architectures: {architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type != "default":
        raise SpecError(f"{source}: rope type {rope_type!r} is not supported yet (only the default rotary embedding)")
    theta = config.get("rope_theta", rope.get("rope_theta") if isinstance(rope, dict) else None)
    if config.get("use_sliding_window"):
        raise SpecError(f"{source}: sliding-window attention layers are not supported yet")
    if config.get("mlp_bias"):
        raise SpecError(f"{source}: mlp_bias is not supported")
    if architecture == "LlamaForCausalLM" and config.get("attention_bias"):
        raise SpecError(f"{source}: attention_bias is not supported for Llama yet")
    if config.get("hidden_act", "silu") != "silu":
        raise SpecError(f"{source}: hidden_act {config.get('hidden_act')!r} is not supported (only silu)")
    heads = get("num_attention_heads")
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    eos = config.get("eos_token_id")
    extra = (("num_nextn_predict_layers", config.get("num_nextn_predict_layers", 0)),) if architecture == "MiMoForCausalLM" else ()
    return dense_spec(
        architecture=architecture,
        vocab_size=get("vocab_size"),
        hidden_size=get("hidden_size"),
        intermediate_size=get("intermediate_size"),
        num_hidden_layers=get("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or get("hidden_size") // heads,
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta if theta is not None else 10000.0),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype if dtype in ("float32", "bfloat16") else "bfloat16",
        eos_token_id=eos[0] if isinstance(eos, list) and eos else eos,
        extra=extra,
    )


def to_hf_config(spec: ModelSpec) -> dict:
    """A config.json that Hugging Face transformers reads as the same model."""
    model_type, qkv_bias, _, _ = ARCHITECTURES[spec.architecture]
    fields = dense_fields(spec)
    config = {
        "architectures": [spec.architecture],
        "model_type": model_type,
        **{k: fields[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
                                  "tie_word_embeddings")},
        "hidden_act": "silu",
        "torch_dtype": spec.dtype,
        **dict(spec.extra),
    }
    if model_type == "llama":
        config.update(attention_bias=qkv_bias, mlp_bias=False)
    if model_type in ("qwen2", "mimo"):
        config.update(use_sliding_window=False)
    if spec.eos_token_id is not None:
        config["eos_token_id"] = spec.eos_token_id
    return config


def _tiny(**changes) -> ModelSpec:
    fields = dict(architecture="Qwen3ForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                  max_position_embeddings=2048, tie_word_embeddings=True, dtype="bfloat16", eos_token_id=None)
    return dense_spec(**{**fields, **changes})


FAMILY = Family(
    name="dense",
    architectures=tuple(ARCHITECTURES),
    from_config=from_config,
    to_hf_config=to_hf_config,
    ignored_prefixes=lambda spec: IGNORED_PREFIXES.get(spec.architecture, ()),
    contract="tiny-dense",
    presets={
        # Tiny random-weight models, fast on a CPU.
        "tiny-dense": _tiny(),
        # The shape of Qwen3-0.6B's config.json with random weights: a real-sized model for GPU audits.
        "qwen3-0.6b-random": _tiny(vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960),
        # Qwen3-8B's shape (8.2B parameters, 16.4 GB in bf16): GPU only, never built on a CPU test machine.
        "qwen3-8b-random": _tiny(vocab_size=151_936, hidden_size=4096, intermediate_size=12_288, num_hidden_layers=36,
                                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
                                 tie_word_embeddings=False),
    },
)
