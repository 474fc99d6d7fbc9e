"""Full-vocabulary log-probabilities: the invariant reference (fixed vocab blocks and trees) and torch's log_softmax."""

from ...runtime.registry import Impl
from .. import reduce
from ..common import ALL_CASES
from . import native, probe, reference, triton


def register(registry) -> None:
    """Register this family's impls and admission probe(s) with `registry`."""
    registry.register(Impl(id="logprobs.reference", version=1, region="logprobs", cases=ALL_CASES, fn=reference.logprobs, sources=(reduce,),
                           vocab_parallel=reference.vocab_parallel))
    registry.register(Impl(id="logprobs.native", version=1, region="logprobs", cases=ALL_CASES, fn=native.logprobs))
    registry.register_probe("logprobs", probe.probe)
    triton.register(registry)  # skipped where Triton is not installed
