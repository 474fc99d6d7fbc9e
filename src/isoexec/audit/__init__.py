"""`isoexec audit`: is every rollout log-probability bitwise equal to the trainer's?"""

from .run import all_equal, render, run_audit
from .trace import Tracer

__all__ = ["Tracer", "all_equal", "render", "run_audit"]
