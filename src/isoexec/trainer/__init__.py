"""The trainer side of IsoExec."""

from .score import TRAINER_CASES, Trainer, micro_batches, sequence_logprobs

__all__ = ["TRAINER_CASES", "Trainer", "micro_batches", "sequence_logprobs"]
