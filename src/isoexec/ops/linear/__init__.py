"""y = x Wᵀ (+ b): the invariant reference (plain and leaf-tree) and the native GEMM."""

from ...runtime.registry import REGISTRY, Impl
from .. import reduce
from ..common import ALL_CASES
from . import native, probe, reference, row_parallel_triton, triton

REGISTRY.register(Impl(id="linear.reference", version=1, region="linear", cases=ALL_CASES, fn=reference.linear, sources=(reduce,)))
REGISTRY.register(Impl(id="linear.row_parallel.reference", version=1, region="linear.row_parallel", cases=ALL_CASES, fn=reference.row_parallel_linear, sources=(reduce,)))
REGISTRY.register(Impl(id="linear.native", version=1, region="linear", cases=ALL_CASES, fn=native.linear))
REGISTRY.register_probe("linear", probe.probe)
REGISTRY.register_probe("linear.row_parallel", probe.probe)
triton.register(REGISTRY)  # skipped where Triton is not installed
row_parallel_triton.register(REGISTRY)  # likewise
