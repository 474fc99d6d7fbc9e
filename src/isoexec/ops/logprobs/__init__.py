"""Full-vocabulary log-probabilities: the invariant reference (fixed vocab blocks and trees) and torch's log_softmax."""

from ...runtime.registry import REGISTRY, Impl
from .. import reduce
from ..common import ALL_CASES
from . import native, probe, reference, triton

REGISTRY.register(Impl(id="logprobs.reference", version=1, region="logprobs", cases=ALL_CASES, fn=reference.logprobs, sources=(reduce,)))
REGISTRY.register(Impl(id="logprobs.native", version=1, region="logprobs", cases=ALL_CASES, fn=native.logprobs))
REGISTRY.register_probe("logprobs", probe.probe)
triton.register(REGISTRY)  # skipped where Triton is not installed
