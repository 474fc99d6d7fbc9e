"""The op families. Importing this package registers every impl and probe with `runtime.REGISTRY`."""

from . import activation, attention, embedding, linear, logprobs, residual, rms_norm, rope, sampling  # noqa: F401
