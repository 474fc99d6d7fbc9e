"""Gated DeltaNet (Qwen3-Next, Qwen3.5): the depthwise causal conv (`gdn.conv`) and the gated delta rule
core (`gdn.core`), each with an invariant reference and the two-form native path."""

from ...runtime.registry import Impl
from .. import reduce
from ..common import ALL_CASES
from . import conv, conv_triton, native, probe, reference, triton


def register(registry) -> None:
    """Register this family's impls and admission probes with `registry`."""
    registry.register(Impl(id="gdn.conv.reference", version=1, region="gdn.conv", cases=ALL_CASES, fn=conv.causal_conv))
    registry.register(Impl(id="gdn.conv.native", version=1, region="gdn.conv", cases=ALL_CASES, fn=conv.native_causal_conv))
    registry.register(Impl(id="gdn.core.reference", version=1, region="gdn.core", cases=ALL_CASES, fn=reference.gdn_core, sources=(reduce,),
                           row_width=reference.row_width))
    registry.register(Impl(id="gdn.core.native", version=1, region="gdn.core", cases=ALL_CASES, fn=native.gdn_core,
                           row_width=native.row_width))
    registry.register_probe("gdn.conv", probe.conv)
    registry.register_probe("gdn.core", probe.core)
    triton.register(registry)  # skipped where Triton is not installed
    conv_triton.register(registry)
