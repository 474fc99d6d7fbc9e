"""The model's shape, read from a Hugging Face `config.json` in one place, or from a named preset."""

import json
from dataclasses import dataclass, fields
from pathlib import Path

ARCHITECTURES = {
    # architecture -> (q/k/v bias, o_proj bias, q/k RMSNorm)
    "Qwen3ForCausalLM": (False, False, True),
    "Qwen2ForCausalLM": (True, False, False),
    "LlamaForCausalLM": (False, False, False),
}
DTYPES = ("float32", "bfloat16")

# The norms that follow a residual add. The model calls each fused, (h, residual) -> (normed, h + residual),
# as `rms_norm.residual` computes it; a contract that pins one in plain `rms_norm` has it composed with
# its `residual_add` op when the ops are bound (`model/binding.py`).
RESIDUAL_NORM_OPS = ("input_layernorm", "post_attention_layernorm", "norm")


class SpecError(ValueError):
    """A config that cannot describe a supported model; the message names the field."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype: str = "bfloat16"
    eos_token_id: int | None = None

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise SpecError(f"architectures: {self.architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type is int and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SpecError(f"{f.name}: expected a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise SpecError(f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise SpecError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not (isinstance(self.rms_norm_eps, float) and self.rms_norm_eps > 0):
            raise SpecError(f"rms_norm_eps: expected a positive float, got {self.rms_norm_eps!r}")

    @property
    def qkv_bias(self) -> bool:
        return ARCHITECTURES[self.architecture][0]

    @property
    def o_bias(self) -> bool:
        return ARCHITECTURES[self.architecture][1]

    @property
    def qk_norm(self) -> bool:
        return ARCHITECTURES[self.architecture][2]

    @property
    def ops(self) -> frozenset[str]:
        """The contract ops this architecture calls (`residual_add` only through a composed norm, see
        RESIDUAL_NORM_OPS)."""
        names = {"embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head",
                 "rotary_emb", "self_attn", "silu_mul", "logprobs", "sample", *RESIDUAL_NORM_OPS}
        return frozenset(names | ({"q_norm", "k_norm"} if self.qk_norm else set()))

    @property
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(N, K) of each projection's weight [N, K]."""
        q, kv, hidden = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim, self.hidden_size
        return {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q),
                "gate_proj": (self.intermediate_size, hidden), "up_proj": (self.intermediate_size, hidden),
                "down_proj": (hidden, self.intermediate_size), "lm_head": (self.vocab_size, hidden)}

    def to_hf_config(self) -> dict:
        """A config.json that Hugging Face transformers reads as the same model."""
        qkv_bias, o_bias, _ = ARCHITECTURES[self.architecture]
        model_type = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}[self.architecture]
        config = {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": self.dtype,
        }
        if model_type == "llama":
            config.update(attention_bias=qkv_bias, mlp_bias=False)
        if model_type == "qwen2":
            config.update(use_sliding_window=False)
        if self.eos_token_id is not None:
            config["eos_token_id"] = self.eos_token_id
        return config


def from_hf_config(config: dict, source: str = "config.json") -> ModelSpec:
    """Read the fields IsoExec needs from a Hugging Face config dict; refuse what it cannot run."""

    def get(name, default=None, required=True):
        if name in config:
            return config[name]
        if required and default is None:
            raise SpecError(f"{source}: missing {name}")
        return default

    try:
        architectures = get("architectures")
        if not isinstance(architectures, list) or len(architectures) != 1:
            raise SpecError(f"{source}: architectures must list exactly one class, got {architectures!r}")
        architecture = architectures[0]
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
        return ModelSpec(
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
            dtype=dtype if dtype in DTYPES else "bfloat16",
            eos_token_id=eos[0] if isinstance(eos, list) and eos else eos,
        )
    except SpecError:
        raise
    except (TypeError, ValueError) as error:
        raise SpecError(f"{source}: {error}") from None


def read_config(directory: str | Path) -> ModelSpec:
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{directory}: not a model directory (no config.json)") from None
    except (OSError, ValueError) as error:
        raise SpecError(f"{path}: unreadable ({error})") from None
    if not isinstance(config, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return from_hf_config(config, str(path))


# Named presets: tiny random-weight models, fast on a CPU.
PRESETS = {
    "tiny-dense": ModelSpec(
        architecture="Qwen3ForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
        max_position_embeddings=2048, tie_word_embeddings=True, dtype="bfloat16", eos_token_id=None,
    ),
    # The shape of Qwen3-0.6B's config.json with random weights: a real-sized model for GPU audits.
    "qwen3-0.6b-random": ModelSpec(
        architecture="Qwen3ForCausalLM", vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
        max_position_embeddings=40_960, tie_word_embeddings=True, dtype="bfloat16", eos_token_id=None,
    ),
}
