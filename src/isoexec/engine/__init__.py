"""The rollout engine: paged KV cache, continuous batching, chunked prefill, prefix caching and
preemption by recompute, every forward run with the contract's engine ops."""

from .config import EngineConfig, SamplingParams
from .llm_engine import LLMEngine
from .sequence import Completion

__all__ = ["Completion", "EngineConfig", "LLMEngine", "SamplingParams"]
