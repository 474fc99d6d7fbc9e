"""The op families, one folder each: the plain-PyTorch reference, the Triton kernel, the native
baseline, the admission probe and (where an impl has tunable constants) its tuning rules by device arch.

`register(registry)` is the one call that registers every family's impls and probes; the process-wide
`runtime.REGISTRY` makes it on first use.
"""

from . import activation, attention, embedding, gdn, linear, logprobs, mla, moe, residual, rms_norm, rope, sampling

FAMILIES = (activation, attention, embedding, gdn, linear, logprobs, mla, moe, residual, rms_norm, rope, sampling)


def register(registry) -> None:
    for family in FAMILIES:
        family.register(registry)
