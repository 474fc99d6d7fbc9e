"""Causal GQA attention over a slot-addressed key/value store: the invariant reference, its Triton kernel and native SDPA."""

from ...runtime.registry import REGISTRY, Impl
from .. import reduce
from ..common import ALL_CASES
from . import native, probe, reference, triton
from .metadata import packed_slot_table, paged_slot_table  # noqa: F401

REGISTRY.register(Impl(id="attention.reference", version=1, region="attention", cases=ALL_CASES, fn=reference.attention,
                       check_constants=reference.check_constants, sources=(reduce,)))
REGISTRY.register(Impl(id="attention.native", version=1, region="attention", cases=ALL_CASES, fn=native.attention))
REGISTRY.register_probe("attention", probe.probe)
triton.register(REGISTRY)  # skipped where Triton is not installed
