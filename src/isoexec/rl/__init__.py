"""On-policy RL with a bitwise gate: GRPO/DAPO, weight sync with digests, tasks, checkpoints.

`GateError` and `RLRun` are imported on first use, so reading the RL config (the CLI builds its
`demo` and `train` flags from it) does not import torch.
"""

from .config import RLConfig

__all__ = ["GateError", "RLConfig", "RLRun"]


def __getattr__(name: str):
    if name == "GateError":
        from .gate import GateError

        return GateError
    if name == "RLRun":
        from .loop import RLRun

        return RLRun
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
