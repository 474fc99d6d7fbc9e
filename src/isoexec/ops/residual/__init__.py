"""Residual add with a declared dtype."""

from ...runtime.registry import REGISTRY, Impl
from ..common import ALL_CASES
from . import native, probe, reference

REGISTRY.register(Impl(id="residual.reference", version=1, region="residual", cases=ALL_CASES, fn=reference.add))
REGISTRY.register(Impl(id="residual.native", version=1, region="residual", cases=ALL_CASES, fn=native.add))
REGISTRY.register_probe("residual", probe.probe)
