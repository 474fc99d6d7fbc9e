"""IsoExec's decoder as a vLLM model: vLLM schedules, batches and pages the KV cache; every op of a forward
is the contract's, bound for the engine cases, exactly as in IsoExec's own engine.

- The contract: `ISOEXEC_CONTRACT` (a preset name or a contract file; the model family's where unset), fitted to the
  model on vLLM's device.
- The cache: vLLM allocates caches only for the layers it knows, so each layer that keeps state owns a holder that
  is never called: an `Attention` built with IsoExec's attention backend (`attention.py`) for keys and values or an
  mla layer's latent rows, per token in vLLM's blocks, read and written in place at vLLM's own slot numbers; a
  `state.StateHolder` for a gdn layer's per-sequence states, in vLLM's state slots. Attention's bits depend on the
  keys' positions, never on their slots.
- The batch: vLLM's attention metadata carries the integers IsoExec's `PagedBatch` is made of (query_start_loc,
  seq_lens, block_table, slot_mapping).
- `compute_logits` returns the contract's full-vocabulary log-probabilities (`logprobs` op), and vLLM must run
  with `logprobs_mode="raw_logits"`, which reports them as they are (the default takes a log-softmax of them
  once more, changing the last bits). The token of a seeded request is the contract's `sample` op's draw
  (`draw.ContractDraw`).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention.attention import Attention
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid

from ..contract import fit_contract, load
from ..model import family_of, from_hf_config, read_config
from ..model.context import PagedBatch, Step, step
from ..model.decoder import Decoder
from ..model.spec import KVPages, LatentPages, RecurrentState
from ..model.state import PagedKV, PagedLatent
from ..model.weights import assign
from ..ops import triton_support
from ..rl.handshake import side_fingerprint
from ..rl.sync import load_state, weights_digest
from ..runtime.binding import bind
from .attention import IsoExecAttentionBackend, cache_views, latent_view
from .state import SequenceSlots, StateHolder, recurrent_layout

ENGINE_CASES = ("engine_prefill", "engine_decode")


def served(vllm_config):
    """(the model's spec, the contract fitted to it) for the model vLLM is configured to run, on its device."""
    directory = Path(vllm_config.model_config.model)
    # The checkpoint's own config.json where there is one, read as IsoExec's engine reads it: the config object vLLM
    # holds went through transformers, which renames some fields by version (Qwen3-MoE's num_experts, for one).
    spec = read_config(directory) if (directory / "config.json").is_file() else from_hf_config(vllm_config.model_config.hf_config.to_dict())
    chosen = os.environ.get("ISOEXEC_CONTRACT") or family_of(spec).contract  # by default the family's, as IsoExec's commands
    return spec, fit_contract(load(chosen), spec, device=device_of(vllm_config))


def device_of(vllm_config) -> str:
    return str(vllm_config.device_config.device_type)


class IsoExecForCausalLM(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        spec, contract = served(vllm_config)
        if any(isinstance(layer.state(), RecurrentState) for layer in spec.layers) and vllm_config.cache_config.enable_prefix_caching:
            raise ValueError(f"isoexec's vLLM plugin serves {spec.architecture}'s per-sequence (gdn) state without prefix caching: "
                             "start vLLM with enable_prefix_caching=False (--no-enable-prefix-caching)")
        mode = vllm_config.model_config.logprobs_mode
        if mode != "raw_logits":
            raise ValueError(f"isoexec's vLLM plugin hands vLLM the contract's log-probabilities as logits: run vLLM with "
                             f"logprobs_mode=\"raw_logits\" to get them as they are (got {mode!r})")
        self.spec = spec
        self.decoder = Decoder(spec)
        self.contract = contract
        self.device = device_of(vllm_config)
        self.binding = bind(contract, spec, ENGINE_CASES)
        kernels = sorted({impl.ref for impl in self.binding.installed.values() if impl.gpu_kernels})
        if self.device == "cpu" and kernels and not triton_support.interpreting():
            raise ValueError(f"contract {contract.name} runs Triton kernels ({', '.join(kernels)}), which this CPU worker cannot: "
                             "serve it on a GPU, or pick a contract of reference kernels with ISOEXEC_CONTRACT")
        self.ops = self.binding.ops
        # One holder per layer that keeps state: keys and values (gqa) or an mla layer's latent rows (kept in the key |
        # value channels of a one-head holder ceil(width / 2) wide), per token in vLLM's paged cache; a gdn layer's
        # states per sequence, in vLLM's state slots (state.py).
        self.holders = nn.ModuleDict()
        for i, layer in enumerate(spec.layers):
            declared = layer.state()
            if isinstance(declared, RecurrentState):
                self.holders[str(i)] = StateHolder(*recurrent_layout(spec, contract, self.binding), vllm_config, f"{prefix}state.{i}")
                continue
            if isinstance(declared, KVPages):
                shape = (layer.mixer.num_heads, declared.head_dim, declared.num_kv_heads)
            elif isinstance(declared, LatentPages):
                shape = (1, -(-declared.width // 2), 1)
            else:
                continue
            self.holders[str(i)] = Attention(shape[0], shape[1], 1.0, shape[2], cache_config=vllm_config.cache_config,
                                             prefix=f"{prefix}attn.{i}", attn_backend=IsoExecAttentionBackend)

    def _state(self, index: int, layer, metadata: dict, seq_ids: torch.Tensor):
        """Layer `index`'s store over its holder's cache or slots (model/state.py's kinds), or None."""
        holder = self.holders[str(index)] if str(index) in self.holders else None
        if holder is None:
            return None
        declared = layer.state()
        if isinstance(declared, RecurrentState):  # each request's slot: the first column of its group's block table
            return SequenceSlots(holder, metadata[holder.layer_name].block_table[:, 0].long()[seq_ids])
        if isinstance(declared, KVPages):
            return PagedKV(*cache_views(holder.kv_cache, declared.head_dim))
        return PagedLatent(latent_view(holder.kv_cache, declared.width))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        with step(Step(case="engine_prefill", ops=self.ops["engine_prefill"], batch=None, state=())):
            return self.ops["engine_prefill"]["embed_tokens"](input_ids, self.decoder.model.embed_tokens.weight)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors=None, inputs_embeds=None,
                **kwargs) -> torch.Tensor:
        first = next(h for h in self.holders.values() if isinstance(h, Attention))
        layers = get_forward_context().attn_metadata
        metadata = layers.get(first.layer_name) if isinstance(layers, dict) else None
        if metadata is None:  # vLLM's profile and warm-up runs: no cache to read
            return torch.zeros(input_ids.shape[0], self.spec.hidden_size, dtype=getattr(torch, self.spec.dtype), device=input_ids.device)
        num_tokens = metadata.num_tokens
        starts = metadata.query_start_loc
        seq_ids = torch.repeat_interleave(torch.arange(starts.shape[0] - 1, device=starts.device), starts[1:] - starts[:-1])[:num_tokens]
        block_size = first.kv_cache.shape[2]
        batch = PagedBatch.of(metadata.block_table.long(), block_size, int(metadata.seq_lens.max()), seq_ids, positions[:num_tokens])
        state = tuple(self._state(i, layer, layers, seq_ids) for i, layer in enumerate(self.spec.layers))
        # vLLM may mix prefill chunks and decodes in one step (IsoExec's engine runs them as two forwards): such a
        # step runs as engine_prefill, whose ops, like every case's, give each row the trainer's bits.
        case = "engine_decode" if metadata.max_query_len == 1 else "engine_prefill"
        with step(Step(case=case, ops=self.ops[case], batch=batch, state=state)):
            hidden = self.decoder(input_ids[:num_tokens], positions[:num_tokens])
        out = hidden.new_zeros(input_ids.shape[0], hidden.shape[1])  # vLLM may pad the batch past its tokens
        out[:num_tokens] = hidden
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        with step(Step(case="engine_decode", ops=self.ops["engine_decode"], batch=None, state=())):
            return self.decoder.logprobs(hidden)

    def load_weights(self, weights) -> set[str]:
        """vLLM's loader: a checkpoint's tensors, by their Hugging Face names."""
        assign(self.decoder, dict(weights), self.spec.architecture)
        return {name for name, _ in self.named_parameters()}

    def fingerprint(self) -> dict:
        """What this worker runs, for the handshake with IsoExec's trainer (`worker.WorkerExtension`)."""
        return side_fingerprint(self.binding, "engine", device=self.device, spec=self.spec)

    def load_state(self, tensors: dict[str, torch.Tensor], digest: str) -> str:
        """The trainer's weights by IsoExec's own names (`rl.sync.state_bytes`); their SHA-256 here must be `digest`."""
        return load_state(self.decoder, tensors, digest)

    def digest(self) -> str:
        return weights_digest(self.decoder)


class IsoExecHybridForCausalLM(IsoExecForCausalLM, HasInnerState, IsHybrid):
    """The decoder of a model with per-sequence (gdn) layers: vLLM sizes and pages their state slots by these."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        spec, contract = served(vllm_config)
        return recurrent_layout(spec, contract, bind(contract, spec, ENGINE_CASES))[0]

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        spec, contract = served(vllm_config)
        return recurrent_layout(spec, contract, bind(contract, spec, ENGINE_CASES))[1]

    @classmethod
    def get_mamba_state_copy_func(cls):
        return ()  # only vLLM's prefix caching of states copies them, and the plugin serves these models without it
