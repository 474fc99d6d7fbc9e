"""On-policy RL with a bitwise gate: GRPO/DAPO, weight sync with digests, tasks, checkpoints."""

from .config import RLConfig
from .gate import GateError
from .loop import RLRun

__all__ = ["GateError", "RLConfig", "RLRun"]
