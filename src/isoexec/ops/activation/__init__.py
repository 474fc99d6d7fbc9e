"""SwiGLU activation: invariant reference, the same formula as one Triton kernel, and the F.silu fast path."""

from ...runtime.registry import REGISTRY, Impl
from ..common import ALL_CASES
from . import native, probe, reference, triton

REGISTRY.register(Impl(id="activation.reference", version=1, region="activation", cases=ALL_CASES, fn=reference.silu_mul))
REGISTRY.register(Impl(id="activation.native", version=1, region="activation", cases=ALL_CASES, fn=native.silu_mul))
REGISTRY.register_probe("activation", probe.probe)
triton.register(REGISTRY)  # skipped where Triton is not installed
