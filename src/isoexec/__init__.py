"""IsoExec: bitwise identical token log-probabilities between an RL trainer and its rollout engine."""

__version__ = "0.1.0"
