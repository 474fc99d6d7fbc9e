"""IsoExec's attention backend for vLLM (`register_backend("ISOEXEC", ...)` in `plugin.register`): what vLLM needs to
allocate and describe the paged KV cache of IsoExec's attention layers, and nothing that computes.

- The cache is token-major inside a block (vLLM's `LBNHC` layout: [blocks, block size, kv heads, keys | values]),
  so a layer's cache viewed as [blocks · block size, kv heads, 2 · head dim] is indexed by vLLM's slot numbers as
  they are: IsoExec's attention reads keys and values there (`cache_views`) and writes the step's keys at vLLM's slot
  mapping, with no copy and no renumbering. Any head size and any block size.
- The metadata is the step's integers (query starts, sequence lengths, block table, slot mapping), from which
  `model.IsoExecForCausalLM` builds IsoExec's `PagedBatch` once per step.
- The impl is never called: IsoExec's decoder computes attention with the contract's op, which gives each row
  the bits of the trainer's whatever the chunking, the batch and the cache's block layout (keys are visited in the
  contract's fixed absolute key blocks, by position)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl, AttentionMetadataBuilder, CommonAttentionMetadata,
                                       MultipleOf)
from vllm.v1.kv_cache_interface import KVCacheLayout

NAME = "ISOEXEC"


def cache_views(cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's keys and values [slots, kv heads, head dim] over vLLM's cache tensor (logical [blocks, kv heads, block
    size, 2 · head dim], token-major in memory): views, so writes land in vLLM's cache."""
    if cache.dim() != 4 or cache.shape[-1] != 2 * head_dim:
        raise ValueError(f"isoexec's attention reads a cache of [blocks, kv heads, block size, {2 * head_dim}], got {list(cache.shape)}")
    rows = cache.permute(0, 2, 1, 3)  # [blocks, block size, kv heads, 2D]: contiguous in the LBNHC layout
    if not rows.is_contiguous():
        raise ValueError("isoexec's attention reads vLLM's KV cache in its LBNHC (token-major) layout; this one is not "
                         "(VLLM_KV_CACHE_LAYOUT or another backend chose another)")
    rows = rows.view(-1, cache.shape[1], cache.shape[-1])
    return rows[..., :head_dim], rows[..., head_dim:]


def latent_view(cache: torch.Tensor, width: int) -> torch.Tensor:
    """An mla layer's cached rows [slots, width] over a one-head holder's cache (its keys, then its values)."""
    if cache.dim() != 4 or cache.shape[1] != 1 or cache.shape[-1] < width:
        raise ValueError(f"isoexec's latent rows need a one-head cache of at least {width} channels, got {list(cache.shape)}")
    k, _ = cache_views(cache, cache.shape[-1] // 2)
    return k.as_strided((k.shape[0], width), (k.stride(0), 1))


@dataclass
class IsoExecMetadata:
    num_tokens: int  # tokens of the step, without vLLM's padding
    max_query_len: int  # 1: every request decodes one token
    query_start_loc: torch.Tensor  # [requests + 1]
    seq_lens: torch.Tensor  # [requests]: keys each request has after this step
    block_table: torch.Tensor  # [requests, blocks]
    slot_mapping: torch.Tensor  # [tokens]


class IsoExecMetadataBuilder(AttentionMetadataBuilder[IsoExecMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False) -> IsoExecMetadata:
        m = common_attn_metadata
        return IsoExecMetadata(m.num_actual_tokens, m.max_query_len, m.query_start_loc, m.seq_lens[: m.num_reqs],
                               m.block_table_tensor[: m.num_reqs], m.slot_mapping[: m.num_actual_tokens])


class IsoExecAttentionImpl(AttentionImpl[IsoExecMetadata]):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto",
                 logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None, **extra):
        self.num_heads, self.head_size, self.num_kv_heads, self.kv_cache_dtype = num_heads, head_size, num_kv_heads, kv_cache_dtype

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None):
        raise RuntimeError("isoexec's attention layers only hold vLLM's cache: IsoExec's decoder computes attention itself")


class IsoExecAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]  # the cache in the model's dtype, as IsoExec's engine keeps it
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls():
        return IsoExecAttentionImpl

    @staticmethod
    def get_builder_cls():
        return IsoExecMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        return [MultipleOf(1)]  # any block size: keys are found through the slot table

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size > 0

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBNHC,)
