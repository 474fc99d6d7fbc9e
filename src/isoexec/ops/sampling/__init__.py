"""Token sampling: Gumbel-max with (seed, position, token)-hashed noise (reference and Triton), and the ordinary batch sampler."""

from ...runtime.registry import Impl
from .. import reduce
from ..logprobs import reference as logprobs_reference
from . import native, probe, reference, triton

ENGINE_CASES = frozenset(("engine_prefill", "engine_decode"))


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(
        Impl(id="sampling.reference", version=1, region="sampling", cases=ENGINE_CASES, fn=reference.sample,
             check_constants=reference.check_constants, sources=(reduce, logprobs_reference))
    )
    registry.register(Impl(id="sampling.native", version=1, region="sampling", cases=ENGINE_CASES, fn=native.sample))
    registry.register_probe("sampling", probe.probe)
    triton.register(registry, ENGINE_CASES)  # skipped where Triton is not installed
