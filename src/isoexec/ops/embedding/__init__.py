"""Token embedding: a gather, exact by construction (discharged by the `exact_gather` proof)."""

from ...runtime.registry import Impl
from ..common import ALL_CASES
from . import native, probe, reference


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="embedding.reference", version=1, region="embedding", cases=ALL_CASES, fn=reference.embedding))
    registry.register(Impl(id="embedding.native", version=1, region="embedding", cases=ALL_CASES, fn=native.embedding))
    registry.register_probe("embedding", probe.probe)
