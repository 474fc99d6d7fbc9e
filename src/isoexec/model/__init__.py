"""The unified model: one definition used by the trainer and the engine in every case."""

from .binding import bind, fit_contract
from .context import PackedKV, PagedKV, Step, current_step, is_tracing, step, tracing
from .dense import DenseModel
from .spec import PRESETS, ModelSpec, SpecError, from_hf_config, read_config
from .weights import init_random, load, load_model, save

__all__ = [
    "PRESETS", "DenseModel", "ModelSpec", "PackedKV", "PagedKV", "SpecError", "Step", "bind", "current_step",
    "fit_contract", "is_tracing", "from_hf_config", "init_random", "load", "load_model", "read_config", "save", "step", "tracing",
]
