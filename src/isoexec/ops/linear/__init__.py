"""y = x Wᵀ (+ b): the invariant reference (plain and leaf-tree) and the native GEMM."""

from ...runtime.registry import Impl
from .. import reduce
from ..common import ALL_CASES
from . import native, probe, reference, row_parallel_triton, triton


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="linear.reference", version=1, region="linear", cases=ALL_CASES, fn=reference.linear, sources=(reduce,),
                           joined=(reference.joined_linear, reference.can_join)))
    registry.register(Impl(id="linear.row_parallel.reference", version=1, region="linear.row_parallel", cases=ALL_CASES,
                           fn=reference.row_parallel_linear, sources=(reduce,),
                           leaf_parts=(reference.row_parallel_partials, reference.row_parallel_fold)))
    registry.register(Impl(id="linear.native", version=1, region="linear", cases=ALL_CASES, fn=native.linear,
                           joined=(native.joined_linear, reference.can_join)))
    registry.register_probe("linear", probe.probe)
    registry.register_probe("linear.row_parallel", probe.probe)
    triton.register(registry)  # skipped where Triton is not installed
    row_parallel_triton.register(registry)  # likewise
