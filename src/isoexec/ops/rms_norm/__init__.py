"""RMSNorm (plain and zero-centred weight), alone and fused with the residual add before it
(`rms_norm.residual`: (x, residual) -> (rms_norm(x + residual), x + residual)): invariant reference,
torch's fused kernel, and one Triton kernel for both; and the gated form of Gated DeltaNet's output
(`rms_norm.gated`: rms_norm(x) · w · silu(z)), reference and native."""

from ...runtime.registry import Impl
from .. import reduce
from ..common import ALL_CASES
from ..residual import reference as residual_reference
from . import gated, native, probe, reference, triton


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="rms_norm.reference", version=1, region="rms_norm", cases=ALL_CASES, fn=reference.rms_norm, sources=(reduce,)))
    registry.register(Impl(id="rms_norm.native", version=1, region="rms_norm", cases=ALL_CASES, fn=native.rms_norm))
    registry.register(Impl(id="rms_norm.residual.reference", version=1, region="rms_norm.residual", cases=ALL_CASES,
                           fn=reference.rms_norm_residual, sources=(reduce, residual_reference)))
    registry.register(Impl(id="rms_norm.residual.native", version=1, region="rms_norm.residual", cases=ALL_CASES, fn=native.rms_norm_residual))
    registry.register(Impl(id="rms_norm.gated.reference", version=1, region="rms_norm.gated", cases=ALL_CASES, fn=gated.reference,
                           sources=(reduce, reference)))
    registry.register(Impl(id="rms_norm.gated.native", version=1, region="rms_norm.gated", cases=ALL_CASES, fn=gated.native))
    registry.register_probe("rms_norm", probe.probe)
    registry.register_probe("rms_norm.gated", probe.probe_gated)
    registry.register_probe("rms_norm.residual", probe.probe_residual)
    triton.register(registry)  # skipped where Triton is not installed
