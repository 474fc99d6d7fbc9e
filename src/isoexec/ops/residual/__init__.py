"""Residual add in a declared compute dtype: the reference, the same add as one Triton kernel, and the plain add."""

from ...runtime.registry import REGISTRY, Impl
from ..common import ALL_CASES
from . import native, probe, reference, triton

REGISTRY.register(Impl(id="residual.reference", version=1, region="residual", cases=ALL_CASES, fn=reference.add))
REGISTRY.register(Impl(id="residual.native", version=1, region="residual", cases=ALL_CASES, fn=native.add))
REGISTRY.register_probe("residual", probe.probe)
triton.register(REGISTRY)  # skipped where Triton is not installed
