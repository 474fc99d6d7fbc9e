"""The trainer side of IsoExec."""

from .score import TRAINER_CASES, micro_batches, sequence_logprobs

__all__ = ["TRAINER_CASES", "micro_batches", "sequence_logprobs"]
