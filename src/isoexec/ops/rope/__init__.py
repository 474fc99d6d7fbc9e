"""Rotary position embedding: one float64-built table by absolute position, and the HF-style path."""

from ...runtime.registry import REGISTRY, Impl
from ..common import ALL_CASES
from . import native, probe, reference

REGISTRY.register(Impl(id="rope.reference", version=1, region="rope", cases=ALL_CASES, fn=reference.rope, check_constants=reference.check_constants))
REGISTRY.register(Impl(id="rope.native", version=1, region="rope", cases=ALL_CASES, fn=native.rope))
REGISTRY.register_probe("rope", probe.probe)
