"""IsoExec's decoder as a vLLM model: vLLM schedules, batches and pages the KV cache; every op of a forward
is the contract's, bound for the engine cases, exactly as in IsoExec's own engine.

- The contract: `ISOEXEC_CONTRACT` (a preset name or a contract file; `tiny-dense` where unset), fitted to the
  model on the CPU.
- The cache: vLLM allocates keys and values only for its `Attention` modules, so each attention layer owns one,
  used as the holder of its cache and never called. Its CPU cache is head-major inside a block
  ([blocks, kv heads, block size, 2 · head dim]); `BlockKV` gathers the blocks a step reads into the slot-major
  [slots, kv heads, head dim] IsoExec's attention reads, block b's slot j at row (b's rank among them) · block size
  + j, and writes each new key both there and into vLLM's block. Attention's bits depend on the keys'
  positions, never on their slots, so the renumbering changes nothing.
- The batch: vLLM's attention metadata carries the integers IsoExec's `PagedBatch` is made of (query_start_loc,
  seq_lens, block_table, slot_mapping).
- `compute_logits` returns the contract's full-vocabulary log-probabilities (`logprobs` op), and vLLM must run
  with `logprobs_mode="raw_logits"`, which reports them as they are (the default takes a log-softmax of them
  once more, changing the last bits). The token of a seeded request is the contract's `sample` op's draw
  (`draw.ContractDraw`).
"""
from __future__ import annotations

import os

import torch
from torch import nn
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention.attention import Attention

from ..contract import fit_contract, load
from ..model import from_hf_config
from ..model.context import PagedBatch, Step, step
from ..model.decoder import Decoder
from ..model.weights import assign
from ..runtime.binding import bind

ENGINE_CASES = ("engine_prefill", "engine_decode")


class BlockKV:
    """One layer's keys and values for one step: the blocks it reads, slot-major, gathered from vLLM's cache; a
    store writes the step's keys to both (IsoExec's attention op reads the returned tensors)."""

    def __init__(self, cache: torch.Tensor, blocks: torch.Tensor, block_size: int, vllm_slots: torch.Tensor, num_kv_heads: int,
                 head_dim: int):
        if cache.dim() != 4 or cache.shape[1] != num_kv_heads or cache.shape[2] != block_size or cache.shape[3] != 2 * head_dim:
            raise ValueError(f"isoexec's vLLM plugin reads vLLM's CPU cache layout [blocks, {num_kv_heads}, {block_size}, "
                             f"{2 * head_dim}], got {list(cache.shape)} (another attention backend)")
        self.cache, self.block_size, self.vllm_slots, self.head_dim = cache, block_size, vllm_slots, head_dim
        kv = cache[blocks].permute(0, 2, 1, 3).reshape(-1, cache.shape[1], cache.shape[-1])  # [U * bs, Hkv, 2D]
        self.k, self.v = kv[..., : self.head_dim].contiguous(), kv[..., self.head_dim :].contiguous()

    def store(self, k: torch.Tensor, v: torch.Tensor, write_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.index_copy_(0, write_slots, k.to(self.k.dtype))
        self.v.index_copy_(0, write_slots, v.to(self.v.dtype))
        block, offset = self.vllm_slots // self.block_size, self.vllm_slots % self.block_size
        self.cache[block, :, offset, : self.head_dim] = k.to(self.cache.dtype)
        self.cache[block, :, offset, self.head_dim :] = v.to(self.cache.dtype)
        return self.k, self.v


def served(vllm_config):
    """(the model's spec, the contract fitted to it) for the model vLLM is configured to run."""
    spec = from_hf_config(vllm_config.model_config.hf_config.to_dict())
    return spec, fit_contract(load(os.environ.get("ISOEXEC_CONTRACT", "tiny-dense")), spec, device="cpu")


class IsoExecForCausalLM(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        spec, contract = served(vllm_config)
        unserved = sorted({layer.mixer.kind for layer in spec.layers} - {"gqa"})
        if unserved:
            raise ValueError(f"isoexec's vLLM plugin serves attention (gqa) layers only; {spec.architecture} has {', '.join(unserved)}")
        mode = vllm_config.model_config.logprobs_mode
        if mode != "raw_logits":
            raise ValueError(f"isoexec's vLLM plugin hands vLLM the contract's log-probabilities as logits: run vLLM with "
                             f"logprobs_mode=\"raw_logits\" to get them as they are (got {mode!r})")
        self.spec = spec
        self.decoder = Decoder(spec)
        self.contract = contract
        self.ops = bind(contract, spec, ENGINE_CASES).ops
        self.block_size = vllm_config.cache_config.block_size
        self.attn = nn.ModuleList(
            Attention(layer.mixer.num_heads, layer.mixer.head_dim, layer.mixer.head_dim**-0.5, layer.mixer.num_kv_heads,
                      cache_config=vllm_config.cache_config, prefix=f"{prefix}attn.{i}")
            for i, layer in enumerate(spec.layers))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        with step(Step(case="engine_prefill", ops=self.ops["engine_prefill"], batch=None, state=())):
            return self.ops["engine_prefill"]["embed_tokens"](input_ids, self.decoder.model.embed_tokens.weight)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors=None, inputs_embeds=None,
                **kwargs) -> torch.Tensor:
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, dict):
            metadata = metadata.get(self.attn[0].layer_name)
        if metadata is None:  # vLLM's profile and warm-up runs: no cache to read
            return torch.zeros(input_ids.shape[0], self.spec.hidden_size, dtype=getattr(torch, self.spec.dtype))
        num_tokens = metadata.num_actual_tokens
        starts = metadata.query_start_loc
        num_seqs = starts.shape[0] - 1
        seq_ids = torch.repeat_interleave(torch.arange(num_seqs), starts[1:] - starts[:-1])[:num_tokens]
        table = metadata.block_table[:num_seqs].long()
        blocks = torch.unique(table)  # sorted: a block's row among them is its compact id
        batch = PagedBatch.of(torch.searchsorted(blocks, table), self.block_size, int(metadata.seq_lens[:num_seqs].max()), seq_ids,
                              positions[:num_tokens])
        slots = metadata.slot_mapping[:num_tokens].long()
        state = tuple(BlockKV(attn.kv_cache, blocks, self.block_size, slots, layer.mixer.num_kv_heads, layer.mixer.head_dim)
                      for attn, layer in zip(self.attn, self.spec.layers))
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
        assign(self.decoder, dict(weights), self.spec.architecture)
        return {name for name, _ in self.named_parameters()}
