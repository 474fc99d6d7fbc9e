"""RMSNorm (plain and zero-centred weight): invariant reference and torch's fused kernel."""

from ...runtime.registry import REGISTRY, Impl
from .. import reduce
from ..common import ALL_CASES
from . import native, probe, reference, triton

REGISTRY.register(Impl(id="rms_norm.reference", version=1, region="rms_norm", cases=ALL_CASES, fn=reference.rms_norm, sources=(reduce,)))
REGISTRY.register(Impl(id="rms_norm.native", version=1, region="rms_norm", cases=ALL_CASES, fn=native.rms_norm))
REGISTRY.register_probe("rms_norm", probe.probe)
triton.register(REGISTRY)  # skipped where Triton is not installed
