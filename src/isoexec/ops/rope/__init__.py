"""Rotary position embedding: one float64-built table by absolute position (YaRN frequency scaling
optional, `scaling.py`) applied by the reference or by one Triton kernel, and the HF-style path."""

from ...runtime.registry import Impl
from ..common import ALL_CASES
from . import native, probe, reference, scaling, triton


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="rope.reference", version=1, region="rope", cases=ALL_CASES, fn=reference.rope, check_constants=reference.check_constants,
                           sources=(scaling,)))
    registry.register(Impl(id="rope.native", version=1, region="rope", cases=ALL_CASES, fn=native.rope, sources=(scaling,)))
    registry.register_probe("rope", probe.probe)
    triton.register(registry)  # skipped where Triton is not installed
