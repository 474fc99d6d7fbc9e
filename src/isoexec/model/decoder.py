"""One decoder for every family and every case, built from a `ModelSpec` and only from contract ops.

Attribute names follow the Hugging Face checkpoints, so `state_dict()` keys are the checkpoint's keys
(a family's key adapter handles the rest). Every arithmetic op goes through the bound op the contract
pins for the current case (`current_step().ops[name]`); the model itself only reshapes, gathers and
routes. Each layer is a mixer and a feed-forward chosen by its `LayerSpec` (`layers/`).

The residual stream travels beside the hidden state, as in vLLM: a decoder layer takes (the previous
layer's feed-forward output, the stream before it) and each norm after a residual add returns (normed,
new stream) from one call, `x, residual = ops[norm](x, residual, weight, eps)`; the first layer's input
norm gets residual None (nothing to add yet). How the add and the norm are computed — one fused kernel
or the two ops one after the other — is the contract's choice (`runtime/binding.py`).
"""

import torch
from torch import Tensor, nn

from .context import current_step
from .layers import FFNS, MIXERS, Embedding, Linear, Norm
from .layers.params import join_all
from .spec import LayerSpec, ModelSpec


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer: LayerSpec, index: int, dtype: torch.dtype):
        super().__init__()
        mixer = MIXERS[layer.mixer.kind](layer.mixer, index, spec.hidden_size, spec.rms_norm_eps, spec.max_position_embeddings, dtype)
        ffn = FFNS[layer.ffn.kind](layer.ffn, index, spec.hidden_size, dtype)
        self.mixer_name, self.ffn_name = mixer.name, ffn.name
        self.add_module(mixer.name, mixer)
        self.add_module(ffn.name, ffn)
        self.input_layernorm = Norm(spec.hidden_size, dtype)
        self.post_attention_layernorm = Norm(spec.hidden_size, dtype)
        self.eps = spec.rms_norm_eps
        self.centred = (True,) if spec.zero_centered_norms else ()  # the norms' zero_centered argument

    def forward(self, h: Tensor, residual: Tensor | None, positions: Tensor) -> tuple[Tensor, Tensor]:
        ops = current_step().ops
        h, residual = ops["input_layernorm"](h, residual, self.input_layernorm.weight, self.eps, *self.centred)
        h = getattr(self, self.mixer_name)(h, positions)
        h, residual = ops["post_attention_layernorm"](h, residual, self.post_attention_layernorm.weight, self.eps, *self.centred)
        return getattr(self, self.ffn_name)(h), residual


class Body(nn.Module):
    def __init__(self, spec: ModelSpec, dtype: torch.dtype):
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size, dtype)
        self.layers = nn.ModuleList(DecoderLayer(spec, layer, i, dtype) for i, layer in enumerate(spec.layers))
        self.norm = Norm(spec.hidden_size, dtype)


class Decoder(nn.Module):
    """input_ids [T], positions [T] -> final hidden states [T, hidden]; `logprobs` maps them to [T, V]."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        dtype = getattr(torch, spec.dtype)
        self.model = Body(spec, dtype)
        self.lm_head = Linear(spec.hidden_size, spec.vocab_size, False, dtype)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _apply(self, fn, recurse=True):
        # `to`, `cuda`, `bfloat16`… convert each parameter on its own, copying joined siblings apart.
        super()._apply(fn, recurse)
        join_all(self)
        return self

    def forward(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        ops = current_step().ops
        h, residual = ops["embed_tokens"](input_ids, self.model.embed_tokens.weight), None
        for layer in self.model.layers:
            h, residual = layer(h, residual, positions)
        return ops["norm"](h, residual, self.model.norm.weight, self.spec.rms_norm_eps, *((True,) if self.spec.zero_centered_norms else ()))[0]

    def logprobs(self, hidden: Tensor) -> Tensor:
        """Full-vocabulary log-probabilities of the next token: hidden [T, hidden] -> [T, V]."""
        ops = current_step().ops
        return ops["logprobs"](ops["lm_head"](hidden, self.lm_head.weight))
