"""SwiGLU activation: invariant reference, the same formula as one Triton kernel, and the F.silu fast path; and the
sigmoid output gate (`activation.gate`), reference and native."""

from ...runtime.registry import Impl
from ..common import ALL_CASES
from . import gate, native, probe, reference, triton


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="activation.reference", version=1, region="activation", cases=ALL_CASES, fn=reference.silu_mul))
    registry.register(Impl(id="activation.native", version=1, region="activation", cases=ALL_CASES, fn=native.silu_mul))
    registry.register(Impl(id="activation.gate.reference", version=1, region="activation.gate", cases=ALL_CASES, fn=gate.reference))
    registry.register(Impl(id="activation.gate.native", version=1, region="activation.gate", cases=ALL_CASES, fn=gate.native))
    registry.register_probe("activation", probe.probe)
    registry.register_probe("activation.gate", probe.probe)
    triton.register(registry)  # skipped where Triton is not installed
