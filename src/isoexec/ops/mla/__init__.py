"""Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash): the absorbed-form invariant reference, its
Triton kernels and the two-form native path."""

from ...runtime.registry import Impl
from .. import reduce
from ..attention import reference as attention_reference
from ..common import ALL_CASES
from ..linear import reference as linear_reference
from . import native, probe, reference, triton


def register(registry) -> None:
    """Register this family's impls and admission probe with `registry`."""
    registry.register(Impl(id="mla.reference", version=1, region="mla", cases=ALL_CASES, fn=reference.mla_attn,
                           check_constants=reference.check_constants, sources=(reduce, attention_reference, linear_reference)))
    registry.register(Impl(id="mla.native", version=1, region="mla", cases=ALL_CASES, fn=native.mla_attn))
    registry.register_probe("mla", probe.probe)
    triton.register(registry)  # skipped where Triton is not installed
