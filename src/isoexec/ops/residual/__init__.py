"""Residual add in a declared compute dtype: the reference, the same add as one Triton kernel, and the plain add."""

from ...runtime.registry import Impl
from ..common import ALL_CASES
from . import native, probe, reference, triton


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="residual.reference", version=1, region="residual", cases=ALL_CASES, fn=reference.add))
    registry.register(Impl(id="residual.native", version=1, region="residual", cases=ALL_CASES, fn=native.add))
    registry.register_probe("residual", probe.probe)
    triton.register(registry)  # skipped where Triton is not installed
