"""Mixture of experts: routing, the routed experts' FFNs and their combine, each its own region
(`moe.router`, `moe.experts`, `moe.combine`), with an invariant reference, Triton kernels and the
native path."""

import torch

from ...runtime.registry import Impl
from .. import reduce
from ..common import ALL_CASES
from ..activation import reference as activation_reference
from ..linear import reference as linear_reference
from ..triton_support import triton_available
from . import experts_triton, native, probe, reference, triton, tuning


def register(registry) -> None:
    """Register this family's impls and admission probes with `registry`."""
    sources = (reduce, linear_reference, activation_reference)
    registry.register(Impl(id="moe.router.reference", version=1, region="moe.router", cases=ALL_CASES, fn=reference.router, sources=sources))
    registry.register(Impl(id="moe.experts.reference", version=1, region="moe.experts", cases=ALL_CASES, fn=reference.experts, sources=sources))
    registry.register(Impl(id="moe.combine.reference", version=1, region="moe.combine", cases=ALL_CASES, fn=reference.combine))
    registry.register(Impl(id="moe.router.native", version=1, region="moe.router", cases=ALL_CASES, fn=native.router))
    registry.register(Impl(id="moe.experts.native", version=1, region="moe.experts", cases=ALL_CASES, fn=native.experts))
    registry.register(Impl(id="moe.combine.native", version=1, region="moe.combine", cases=ALL_CASES, fn=native.combine))
    if hasattr(torch, "_grouped_mm"):
        registry.register(Impl(id="moe.experts.grouped_mm", version=1, region="moe.experts", cases=ALL_CASES, fn=native.experts_grouped_mm,
                               check_geometry=native.check_grouped_mm_geometry))
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id="moe.router.triton", version=1, region="moe.router", cases=ALL_CASES, fn=triton.router,
                               check_constants=triton.check_constants, tune=tuning.fit_router, sources=triton.SOURCES))
        registry.register(Impl(gpu_kernels=True, id="moe.experts.triton", version=1, region="moe.experts", cases=ALL_CASES,
                               fn=experts_triton.experts, check_constants=triton.check_constants, tune=tuning.fit_experts,
                               sources=experts_triton.SOURCES))
        registry.register(Impl(gpu_kernels=True, id="moe.combine.triton", version=1, region="moe.combine", cases=ALL_CASES, fn=triton.combine,
                               check_constants=triton.check_constants, tune=tuning.fit_combine, sources=triton.SOURCES))
    registry.register_probe("moe.router", probe.router)
    registry.register_probe("moe.experts", probe.experts)
    registry.register_probe("moe.combine", probe.combine)
