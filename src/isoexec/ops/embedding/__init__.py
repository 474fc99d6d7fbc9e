"""Token embedding: a gather, exact by construction (discharged by the `exact_gather` proof)."""

from ...runtime.registry import REGISTRY, Impl
from ..common import ALL_CASES
from . import native, probe, reference

REGISTRY.register(Impl(id="embedding.reference", version=1, region="embedding", cases=ALL_CASES, fn=reference.embedding))
REGISTRY.register(Impl(id="embedding.native", version=1, region="embedding", cases=ALL_CASES, fn=native.embedding))
REGISTRY.register_probe("embedding", probe.probe)
