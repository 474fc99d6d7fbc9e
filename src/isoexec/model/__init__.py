"""The unified model: one decoder, built per family from a `ModelSpec`, used by the trainer and the
engine in every case."""

from .context import PackedBatch, PagedBatch, Step, current_step, is_tracing, routing_buffer, step, tracing
from .decoder import Decoder
from .families import FAMILIES, PRESETS, Family, family_of, from_hf_config, is_preset, read_config, register_family, spec_of
from .families.dense import dense_fields, dense_spec
from .spec import (RESIDUAL_NORM_OPS, AttentionSpec, GDNSpec, KVPages, LatentPages, LayerSpec, MLASpec, MLPSpec, ModelSpec, MoESpec,
                   RecurrentState, SpecError)
from .state import PACKED, PackedKV, PagedKV, PagedLatent, allocate, packed_state
from .weights import init_random, load, load_model, save

__all__ = [
    "FAMILIES", "PACKED", "PRESETS", "RESIDUAL_NORM_OPS", "AttentionSpec", "Decoder", "Family", "GDNSpec", "KVPages", "LatentPages", "LayerSpec", "MLASpec", "MLPSpec",
    "ModelSpec", "MoESpec", "PackedBatch", "PackedKV", "PagedBatch", "PagedKV", "PagedLatent", "RecurrentState", "SpecError", "Step", "allocate", "current_step", "dense_fields", "dense_spec",
    "family_of", "from_hf_config", "init_random", "is_preset", "is_tracing", "load", "load_model", "packed_state", "read_config",
    "register_family", "routing_buffer", "save", "spec_of", "step", "tracing",
]
