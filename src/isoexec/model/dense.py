"""One dense decoder definition (Qwen3 / Qwen2 / Llama) for every case, built only from contract ops.

Attribute names follow the Hugging Face checkpoints, so `state_dict()` keys are the checkpoint's keys.
Every arithmetic op goes through the bound op the contract pins for the current case
(`current_step().ops[name]`); the model itself only reshapes, gathers and routes.

The residual stream travels beside the hidden state, as in vLLM: a decoder layer takes (the previous
layer's MLP output, the stream before it) and each norm after a residual add returns (normed, new
stream) from one call, `x, residual = ops[norm](x, residual, weight, eps)`; the first layer's input
norm gets residual None (nothing to add yet). How the add and the norm are computed — one fused kernel
or the two ops one after the other — is the contract's choice (`model/binding.py`).
"""

import torch
from torch import Tensor, nn

from .context import current_step
from .spec import ModelSpec


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None


class Norm(nn.Module):
    def __init__(self, size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, dtype: torch.dtype):
        super().__init__()
        self.layer, self.spec = layer, spec
        heads, kv_heads, head_dim = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        self.q_proj = Linear(spec.hidden_size, heads * head_dim, spec.qkv_bias, dtype)
        self.k_proj = Linear(spec.hidden_size, kv_heads * head_dim, spec.qkv_bias, dtype)
        self.v_proj = Linear(spec.hidden_size, kv_heads * head_dim, spec.qkv_bias, dtype)
        self.o_proj = Linear(heads * head_dim, spec.hidden_size, spec.o_bias, dtype)
        if spec.qk_norm:
            self.q_norm = Norm(head_dim, dtype)
            self.k_norm = Norm(head_dim, dtype)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        s, ops, spec = current_step(), current_step().ops, self.spec
        num_tokens = x.shape[0]
        q = ops["q_proj"](x, self.q_proj.weight, self.q_proj.bias).view(num_tokens, spec.num_attention_heads, spec.head_dim)
        k = ops["k_proj"](x, self.k_proj.weight, self.k_proj.bias).view(num_tokens, spec.num_key_value_heads, spec.head_dim)
        v = ops["v_proj"](x, self.v_proj.weight, self.v_proj.bias).view(num_tokens, spec.num_key_value_heads, spec.head_dim)
        if spec.qk_norm:
            q = ops["q_norm"](q, self.q_norm.weight, spec.rms_norm_eps)
            k = ops["k_norm"](k, self.k_norm.weight, spec.rms_norm_eps)
        q = ops["rotary_emb"](q, positions, spec.rope_theta, spec.max_position_embeddings)
        k = ops["rotary_emb"](k, positions, spec.rope_theta, spec.max_position_embeddings)
        k_store, v_store = s.kv.store(self.layer, k, v)
        out = ops["self_attn"](q, k_store, v_store, s.slot_table, s.seq_ids, positions, spec.head_dim**-0.5)  # [T, H, D]
        return ops["o_proj"](out.reshape(num_tokens, -1), self.o_proj.weight, self.o_proj.bias)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype):
        super().__init__()
        self.gate_proj = Linear(spec.hidden_size, spec.intermediate_size, False, dtype)
        self.up_proj = Linear(spec.hidden_size, spec.intermediate_size, False, dtype)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, False, dtype)

    def forward(self, x: Tensor) -> Tensor:
        ops = current_step().ops
        gate = ops["gate_proj"](x, self.gate_proj.weight)
        up = ops["up_proj"](x, self.up_proj.weight)
        return ops["down_proj"](ops["silu_mul"](gate, up), self.down_proj.weight)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: int, dtype: torch.dtype):
        super().__init__()
        self.self_attn = Attention(spec, layer, dtype)
        self.mlp = MLP(spec, dtype)
        self.input_layernorm = Norm(spec.hidden_size, dtype)
        self.post_attention_layernorm = Norm(spec.hidden_size, dtype)
        self.eps = spec.rms_norm_eps

    def forward(self, h: Tensor, residual: Tensor | None, positions: Tensor) -> tuple[Tensor, Tensor]:
        ops = current_step().ops
        h, residual = ops["input_layernorm"](h, residual, self.input_layernorm.weight, self.eps)
        h = self.self_attn(h, positions)
        h, residual = ops["post_attention_layernorm"](h, residual, self.post_attention_layernorm.weight, self.eps)
        return self.mlp(h), residual


class Body(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size, dtype=dtype))
        self.layers = nn.ModuleList(DecoderLayer(spec, i, dtype) for i in range(spec.num_hidden_layers))
        self.norm = Norm(spec.hidden_size, dtype)


class DenseModel(nn.Module):
    """input_ids [T], positions [T] -> final hidden states [T, hidden]; `logprobs` maps them to [T, V]."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        dtype = getattr(torch, spec.dtype)
        self.model = Body(spec, dtype)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, False, dtype)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        ops = current_step().ops
        h, residual = ops["embed_tokens"](input_ids, self.model.embed_tokens.weight), None
        for layer in self.model.layers:
            h, residual = layer(h, residual, positions)
        return ops["norm"](h, residual, self.model.norm.weight, self.spec.rms_norm_eps)[0]

    def logprobs(self, hidden: Tensor) -> Tensor:
        """Full-vocabulary log-probabilities of the next token: hidden [T, hidden] -> [T, V]."""
        ops = current_step().ops
        return ops["logprobs"](ops["lm_head"](hidden, self.lm_head.weight))
