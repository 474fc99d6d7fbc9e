"""Per-sequence state inside vLLM, for layers that keep it (Gated DeltaNet): vLLM allocates it through its
Mamba-style state manager, one slot of each such layer per request, and IsoExec's layer reads and writes it there.

- `StateHolder` is a `MambaBase` layer that only declares the states (`model/spec.RecurrentState`, laid out as
  IsoExec's engine keeps them: the open chunk's rows [C, Hv, width] and the chunk-start state [Hv, Dk, Dv] in fp32,
  the conv's last inputs [W - 1, conv dim] in the model's dtype) and holds what vLLM binds to them. The fp32 states
  come first: vLLM packs a slot's states one after another, and a view in fp32 must start at a multiple of 4 bytes.
- vLLM gives each request one slot per group of such layers for its whole life (prefix caching is off for these
  models, so its state mode is "none"): the first column of the group's block table. A preempted request is recomputed
  from position 0, and a sequence at position 0 starts from zeros whatever its slot holds, as in IsoExec's engine.
- The metadata is IsoExec's attention backend's (`attention.IsoExecMetadataBuilder`), which keeps vLLM's request
  order (no reordering of decodes first), so row i of the block table is request i of the step.
"""
from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from ..model.spec import RecurrentState
from .attention import IsoExecAttentionBackend

NAME = "ISOEXEC_STATE"


def recurrent_layout(spec, contract, binding):
    """(shapes, dtypes) of one slot of the model's gdn layers' states (they share one shape), in `StateHolder`'s order:
    the open chunk of the contract's gdn.core chunk size, each row as wide as its impl keeps it (`row_width`)."""
    declared = next(layer.state() for layer in spec.layers if isinstance(layer.state(), RecurrentState))
    case = next(case for case in ("engine_decode", "engine_prefill") if ("gdn.core", case) in binding.installed)
    constants = dict(contract.entry("gdn.core", case).constants)
    chunk_size = constants["chunk_size"]
    width = binding.installed["gdn.core", case].row_width(declared.num_v_heads, declared.k_head_dim, declared.v_head_dim, constants)
    shapes = ((chunk_size, declared.num_v_heads, width), (declared.num_v_heads, declared.k_head_dim, declared.v_head_dim),
              (declared.conv_kernel - 1, declared.conv_dim))
    return shapes, (torch.float32, torch.float32, getattr(torch, spec.dtype))


class IsoExecStateBackend(IsoExecAttentionBackend):
    """The per-sequence states' backend: the same metadata as the attention's; nothing computes."""

    @staticmethod
    def get_name() -> str:
        return NAME

    @classmethod
    def is_ssm(cls) -> bool:
        return True

    @classmethod
    def supported_kv_cache_layouts(cls):
        return None  # a slot is one packed run of bytes whatever the attention layers' layout


class StateHolder(nn.Module, MambaBase):
    def __init__(self, shapes, dtypes, vllm_config, prefix: str):
        super().__init__()
        self.shapes, self.dtypes, self.prefix, self.layer_name = tuple(shapes), tuple(dtypes), prefix, prefix
        self.kv_cache = ()
        context = vllm_config.compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"duplicate layer name {prefix}")
        context[prefix] = self

    def get_state_shape(self):
        return self.shapes

    def get_state_dtype(self):
        return self.dtypes

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.LINEAR  # a built-in member for vLLM's bookkeeping; the backend is ours

    def get_attn_backend(self):
        return IsoExecStateBackend


class SequenceSlots:
    """One layer's states over its holder's slots, as `model/state.RecurrentSlots` keeps them, with the step's slot of
    each token (`state_ids`): vLLM numbers slots per group of layers."""

    def __init__(self, holder: StateHolder, state_ids: torch.Tensor):
        self.rows, self.state, self.conv = holder.kv_cache
        self.state_ids = state_ids
