"""SwiGLU activation: invariant reference and the F.silu fast path."""

from ...runtime.registry import REGISTRY, Impl
from ..common import ALL_CASES
from . import native, probe, reference

REGISTRY.register(Impl(id="activation.reference", version=1, region="activation", cases=ALL_CASES, fn=reference.silu_mul))
REGISTRY.register(Impl(id="activation.native", version=1, region="activation", cases=ALL_CASES, fn=native.silu_mul))
REGISTRY.register_probe("activation", probe.probe)
