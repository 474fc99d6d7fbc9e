"""A model's shape: the model-wide fields and one spec per layer, a token mixer and a feed-forward.

A family (`families/`) reads a Hugging Face `config.json` into a `ModelSpec`; the decoder builds each
layer from its `LayerSpec` (`layers/`). What the rest of IsoExec needs of a model — the contract ops
it calls, its projections' weight shapes, the state each layer keeps in the engine — is read from
here, never from a family's fields.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

DTYPES = ("float32", "bfloat16")

# The norms that follow a residual add. The model calls each fused, (h, residual) -> (normed, h + residual),
# as `rms_norm.residual` computes it; a contract that pins one in plain `rms_norm` has it composed with
# its `residual_add` op when the ops are bound (`runtime/binding.py`).
RESIDUAL_NORM_OPS = ("input_layernorm", "post_attention_layernorm", "norm")
MODEL_OPS = ("embed_tokens", "lm_head", "logprobs", "sample", *RESIDUAL_NORM_OPS)


class SpecError(ValueError):
    """A config that cannot describe a supported model; the message names the field."""


def check_positive_ints(spec) -> None:
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.type is int and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise SpecError(f"{f.name}: expected a positive int, got {value!r}")


@dataclass(frozen=True)
class KVPages:
    """The state a `gqa` layer keeps in the engine: per token, keys and values of `num_kv_heads` heads
    of `head_dim` (`model/state.py` allocates them in pages)."""

    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class LatentPages:
    """The state an `mla` layer keeps in the engine: per token one row of `width` values, the normed
    compressed latent then the rotated shared rope key (`model/state.py` allocates them in pages)."""

    width: int


@dataclass(frozen=True)
class RecurrentState:
    """The state a `gdn` layer keeps in the engine, per sequence (not per token): the fp32 state at its
    open chunk's start [Hv, Dk, Dv], the open chunk's rows [C, Hv, width] fp32 (laid out by the gdn.core
    impl: `ops/gdn/`), and the conv's last `conv_kernel - 1` inputs [W - 1, conv_dim] in the model dtype."""

    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_dim: int
    conv_kernel: int


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """The `gqa` mixer: causal grouped-query attention with rotary positions."""

    kind: ClassVar[str] = "gqa"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    zero_centered_qk_norm: bool = False  # q_norm / k_norm scale by (1 + w) (Qwen3-Next / Qwen3.5)
    # Qwen3-Next / Qwen3.5: q_proj also emits a gate per head (query then gate, head by head) and the
    # attention output is multiplied by sigmoid(gate) before o_proj (op `attn_gate`).
    output_gate: bool = False
    # Rotary positions on the first `rotary_dim` dims of each head only (partial_rotary_factor); None: all.
    rotary_dim: int | None = None

    def __post_init__(self):
        check_positive_ints(self)
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise SpecError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        rotary = self.rotary_dim
        if rotary is not None and (not isinstance(rotary, int) or isinstance(rotary, bool) or rotary < 2 or rotary % 2 or rotary > self.head_dim):
            raise SpecError(f"rotary dims (head_dim × partial_rotary_factor): expected an even int in 2..{self.head_dim}, got {rotary!r}")

    @property
    def ops(self) -> frozenset[str]:
        return frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "rotary_emb", "self_attn"} | ({"q_norm", "k_norm"} if self.qk_norm else set())
                         | ({"attn_gate"} if self.output_gate else set()))

    def projections(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"q_proj": (q * (2 if self.output_gate else 1), hidden_size), "k_proj": (kv, hidden_size), "v_proj": (kv, hidden_size),
                "o_proj": (hidden_size, q)}

    def norm_widths(self) -> dict[str, int]:
        return {"q_norm": self.head_dim, "k_norm": self.head_dim} if self.qk_norm else {}

    def state(self) -> KVPages:
        return KVPages(self.num_kv_heads, self.head_dim)


@dataclass(frozen=True, kw_only=True)
class MLASpec:
    """The `mla` mixer: multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash). The query comes from
    `q_proj`, or `q_b_proj(q_a_layernorm(q_a_proj(x)))` with `q_lora_rank`; `kv_a_proj_with_mqa` gives the
    compressed latent (`kv_lora_rank`, normed by `kv_a_layernorm`) and one rope key shared by every head;
    rotary positions on the rope parts only. `mla_attn` attends over the cached (latent, rope key) rows
    with `kv_b_proj`'s weight, in the form the contract's impl computes (`ops/mla/`). `scale` is the
    softmax scale as the family defines it (with YaRN's mscale folded in); `rope_scaling` a
    `ops.rope.scaling.Yarn` or None."""

    kind: ClassVar[str] = "mla"
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_theta: float
    scale: float
    rope_interleave: bool = True
    rope_scaling: object = None
    attention_bias: bool = False

    def __post_init__(self):
        check_positive_ints(self)
        if self.q_lora_rank is not None and (not isinstance(self.q_lora_rank, int) or isinstance(self.q_lora_rank, bool) or self.q_lora_rank < 1):
            raise SpecError(f"q_lora_rank: expected a positive int or null, got {self.q_lora_rank!r}")
        if self.qk_rope_head_dim % 2:
            raise SpecError(f"qk_rope_head_dim must be even for rotary embeddings, got {self.qk_rope_head_dim}")
        if not (isinstance(self.scale, float) and self.scale > 0):
            raise SpecError(f"softmax scale: expected a positive float, got {self.scale!r}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def query_ops(self) -> tuple[str, ...]:
        return ("q_proj",) if self.q_lora_rank is None else ("q_a_proj", "q_a_layernorm", "q_b_proj")

    @property
    def ops(self) -> frozenset[str]:
        return frozenset({*self.query_ops, "kv_a_proj_with_mqa", "kv_a_layernorm", "rotary_emb", "mla_attn", "o_proj"})

    def projections(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        """kv_b_proj is not among them: `mla_attn` holds its weight (the absorbed form never runs it as a GEMM)."""
        q = self.num_heads * self.qk_head_dim
        query = {"q_proj": (q, hidden_size)} if self.q_lora_rank is None else {"q_a_proj": (self.q_lora_rank, hidden_size), "q_b_proj": (q, self.q_lora_rank)}
        return {**query, "kv_a_proj_with_mqa": (self.kv_lora_rank + self.qk_rope_head_dim, hidden_size),
                "o_proj": (hidden_size, self.num_heads * self.v_head_dim)}

    def norm_widths(self) -> dict[str, int]:
        return {"kv_a_layernorm": self.kv_lora_rank} | ({} if self.q_lora_rank is None else {"q_a_layernorm": self.q_lora_rank})

    def state(self) -> LatentPages:
        return LatentPages(self.kv_lora_rank + self.qk_rope_head_dim)


@dataclass(frozen=True, kw_only=True)
class GDNSpec:
    """The `gdn` mixer: Gated DeltaNet (Qwen3-Next, Qwen3.5 `linear_attention` layers). `in_proj_qkv` gives
    q, k (Hk heads of Dk) and v (Hv heads of Dv), the depthwise causal conv (`conv1d`, width
    `conv_kernel`, + SiLU) runs over them, `in_proj_z` the output gate, `in_proj_b` / `in_proj_a` the
    delta rule's β and decay inputs; `gdn_core` is the chunked delta rule (`ops/gdn/`), `gated_norm` the
    per-head RMSNorm times silu(z), `out_proj` back to the hidden size."""

    kind: ClassVar[str] = "gdn"
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int

    def __post_init__(self):
        check_positive_ints(self)
        if self.num_v_heads % self.num_k_heads:
            raise SpecError(f"linear_num_value_heads {self.num_v_heads} is not a multiple of linear_num_key_heads {self.num_k_heads}")
        if self.conv_kernel < 2:
            raise SpecError(f"linear_conv_kernel_dim must be at least 2, got {self.conv_kernel}")

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def ops(self) -> frozenset[str]:
        return frozenset({"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "gdn_core", "gated_norm", "out_proj"})

    def projections(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        return {"in_proj_qkv": (self.conv_dim, hidden_size), "in_proj_z": (self.value_dim, hidden_size),
                "in_proj_b": (self.num_v_heads, hidden_size), "in_proj_a": (self.num_v_heads, hidden_size),
                "out_proj": (hidden_size, self.value_dim)}

    def norm_widths(self) -> dict[str, int]:
        return {"gated_norm": self.v_head_dim}

    def state(self) -> RecurrentState:
        return RecurrentState(self.num_v_heads, self.k_head_dim, self.v_head_dim, self.conv_dim, self.conv_kernel)


@dataclass(frozen=True, kw_only=True)
class MLPSpec:
    """The `mlp` feed-forward: down(silu(gate(x)) * up(x))."""

    kind: ClassVar[str] = "mlp"
    intermediate_size: int

    def __post_init__(self):
        check_positive_ints(self)

    @property
    def ops(self) -> frozenset[str]:
        return frozenset({"gate_proj", "up_proj", "down_proj", "silu_mul"})

    def projections(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        i = self.intermediate_size
        return {"gate_proj": (i, hidden_size), "up_proj": (i, hidden_size), "down_proj": (hidden_size, i)}

    def norm_widths(self) -> dict[str, int]:
        return {}

    def state(self) -> None:
        return None


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """The `moe` feed-forward: a router picks `top_k` of `num_experts` SwiGLU experts per token and the
    combine sums their outputs, weighted (ops `router`, `experts`, `combine`).

    DeepSeek-V3 / GLM routing: `scoring` "sigmoid", `score_bias` (the gate's `e_score_correction_bias`,
    for selection only), `n_group` / `topk_group` (group-limited selection), `routed_scaling_factor`.
    `shared_intermediate_size`: the always-on shared expert(s), one SwiGLU MLP of that width (n_shared
    experts × moe_intermediate_size) through the dense ops, added by the combine; None for none."""

    kind: ClassVar[str] = "moe"
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_topk_prob: bool = True
    scoring: str = "softmax"
    score_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_intermediate_size: int | None = None
    # Qwen3-Next / Qwen3.5-MoE: one shared expert (`shared_expert`) whose output the combine scales by
    # sigmoid(shared_expert_gate(x)) before adding it; DeepSeek's `shared_experts` are ungated.
    shared_gate: bool = False

    def __post_init__(self):
        check_positive_ints(self)
        if self.top_k > self.num_experts:
            raise SpecError(f"num_experts_per_tok {self.top_k} exceeds num_experts {self.num_experts}")
        if self.scoring not in ("softmax", "sigmoid"):
            raise SpecError(f"scoring_func: {self.scoring!r} is not supported (softmax, sigmoid)")
        if self.num_experts % self.n_group:
            raise SpecError(f"n_group {self.n_group} does not divide the {self.num_experts} routed experts")
        if self.topk_group > self.n_group:
            raise SpecError(f"topk_group {self.topk_group} exceeds n_group {self.n_group}")
        if self.n_group > 1 and self.top_k > self.topk_group * (self.num_experts // self.n_group):
            raise SpecError(f"num_experts_per_tok {self.top_k} exceeds the {self.topk_group} kept groups' experts")
        if not (isinstance(self.routed_scaling_factor, (int, float)) and self.routed_scaling_factor > 0):
            raise SpecError(f"routed_scaling_factor: expected a positive number, got {self.routed_scaling_factor!r}")
        shared = self.shared_intermediate_size
        if shared is not None and (not isinstance(shared, int) or isinstance(shared, bool) or shared < 1):
            raise SpecError(f"shared experts' width: expected a positive int, got {shared!r}")
        if self.shared_gate and shared is None:
            raise SpecError("a gated shared expert needs its width (shared_expert_intermediate_size)")

    @property
    def ops(self) -> frozenset[str]:
        shared = {"gate_proj", "up_proj", "down_proj", "silu_mul"} if self.shared_intermediate_size else set()
        gated = {"shared_expert_gate"} if self.shared_gate else set()
        return frozenset({"router", "experts", "combine"} | shared | gated)

    def projections(self, hidden_size: int) -> dict[str, tuple[int, int]]:
        # The gate and the experts' GEMMs are the MoE regions' own (their tiles from ops/moe/tuning.py's rule).
        if not self.shared_intermediate_size:
            return {}
        i = self.shared_intermediate_size
        gate = {"shared_expert_gate": (1, hidden_size)} if self.shared_gate else {}
        return {"gate_proj": (i, hidden_size), "up_proj": (i, hidden_size), "down_proj": (hidden_size, i), **gate}

    def norm_widths(self) -> dict[str, int]:
        return {}

    def state(self) -> None:
        return None


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: `mixer` (across tokens) then `ffn` (per token), each after a residual norm."""

    mixer: object  # AttentionSpec, or another mixer spec with the same methods
    ffn: object  # MLPSpec, or another feed-forward spec

    def state(self):
        return self.mixer.state() or self.ffn.state()


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    family: str
    architecture: str
    vocab_size: int
    hidden_size: int
    layers: tuple[LayerSpec, ...]
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype: str = "bfloat16"
    eos_token_id: int | None = None
    # Every RMSNorm but the gated one scales by (1 + w) (Qwen3-Next / Qwen3.5's zero-centred weights).
    zero_centered_norms: bool = False
    # What the family needs to write config.json back (`Family.to_hf_config`), beyond these fields.
    extra: tuple[tuple[str, object], ...] = field(default=())

    def __post_init__(self):
        check_positive_ints(self)
        if not self.layers or not all(isinstance(layer, LayerSpec) for layer in self.layers):
            raise SpecError(f"layers: expected one LayerSpec per layer, got {self.layers!r}")
        object.__setattr__(self, "layers", tuple(self.layers))
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not (isinstance(self.rms_norm_eps, float) and self.rms_norm_eps > 0):
            raise SpecError(f"rms_norm_eps: expected a positive float, got {self.rms_norm_eps!r}")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layers)

    @property
    def ops(self) -> frozenset[str]:
        """The contract ops the model calls (`residual_add` only through a composed norm, see RESIDUAL_NORM_OPS)."""
        return frozenset(MODEL_OPS).union(*(layer.mixer.ops | layer.ffn.ops for layer in self.layers))

    @property
    def residual_norm_ops(self) -> tuple[str, ...]:
        return RESIDUAL_NORM_OPS

    @property
    def projections(self) -> dict[str, dict[tuple[int, int], int]]:
        """op -> {(N, K) of its weight [N, K]: how many layers have it}; lm_head counts once."""
        out: dict[str, dict[tuple[int, int], int]] = {"lm_head": {(self.vocab_size, self.hidden_size): 1}}
        for layer in self.layers:
            for part in (layer.mixer, layer.ffn):
                for op, shape in part.projections(self.hidden_size).items():
                    shapes = out.setdefault(op, {})
                    shapes[shape] = shapes.get(shape, 0) + 1
        return out

    @property
    def norm_widths(self) -> dict[str, int]:
        """op -> the row width each RMSNorm op reduces."""
        out = dict.fromkeys(RESIDUAL_NORM_OPS, self.hidden_size)
        for layer in self.layers:
            out |= layer.mixer.norm_widths() | layer.ffn.norm_widths()
        return out

    @property
    def routing_width(self) -> int:
        """The most experts any layer routes a token to; 0 without an MoE layer (the last dim of `Step.routing`)."""
        return max((layer.ffn.top_k for layer in self.layers if isinstance(layer.ffn, MoESpec)), default=0)

    @property
    def attention(self) -> list[AttentionSpec]:
        """The distinct `gqa` mixers of the model, in layer order."""
        return list(dict.fromkeys(layer.mixer for layer in self.layers if isinstance(layer.mixer, AttentionSpec)))

    @property
    def gdn(self) -> list[GDNSpec]:
        """The distinct `gdn` mixers of the model, in layer order."""
        return list(dict.fromkeys(layer.mixer for layer in self.layers if isinstance(layer.mixer, GDNSpec)))

    @property
    def mla(self) -> list[MLASpec]:
        """The distinct `mla` mixers of the model, in layer order."""
        return list(dict.fromkeys(layer.mixer for layer in self.layers if isinstance(layer.mixer, MLASpec)))

    def to_hf_config(self) -> dict:
        """A config.json that Hugging Face transformers reads as the same model (the family's writer)."""
        from .families import family_of

        return family_of(self).to_hf_config(self)

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)
