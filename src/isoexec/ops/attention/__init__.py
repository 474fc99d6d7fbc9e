"""Causal GQA attention over a slot-addressed key/value store: the invariant reference, its Triton kernel and native SDPA."""

from ...runtime.registry import Impl
from .. import reduce
from ..common import ALL_CASES
from . import native, probe, reference, triton
from .metadata import packed_slot_table, paged_slot_table  # noqa: F401


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="attention.reference", version=1, region="attention", cases=ALL_CASES, fn=reference.attention,
                           check_constants=reference.check_constants, sources=(reduce,)))
    registry.register(Impl(id="attention.native", version=1, region="attention", cases=ALL_CASES, fn=native.attention))
    registry.register_probe("attention", probe.probe)
    triton.register(registry)  # skipped where Triton is not installed
