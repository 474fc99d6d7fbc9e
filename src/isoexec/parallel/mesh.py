"""One side's process layout (a mesh), and starting the processes of one.

A `Mesh` is what a rank knows of its side: the tensor-parallel size and its rank in it, and the process
group its collectives run on (None for one process: every collective is then the identity). `spawn`
starts `world` processes of a side on this machine with `torch.distributed` over gloo (CPU tensors) and
returns what rank 0's function returned; `torchrun` sets the same environment, so `Mesh.from_env` serves
both.
"""

from __future__ import annotations

import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor


@dataclass(frozen=True)
class Mesh:
    """tp ranks of one side, this process being `rank`; `group` the process group of their collectives."""

    tp: int = 1
    rank: int = 0
    group: Any = None

    def __post_init__(self):
        if not isinstance(self.tp, int) or self.tp < 1 or not 0 <= self.rank < self.tp:
            raise ValueError(f"a mesh needs 1 <= tp and 0 <= rank < tp, got tp={self.tp!r}, rank={self.rank!r}")
        if self.tp > 1 and self.group is None and not dist.is_initialized():
            raise ValueError(f"a mesh of tp = {self.tp} needs torch.distributed initialised (spawn, or torchrun)")

    @classmethod
    def from_env(cls) -> "Mesh":
        """The world torch.distributed was initialised with, all of it one tensor-parallel group."""
        if not dist.is_initialized():
            return cls()
        return cls(tp=dist.get_world_size(), rank=dist.get_rank(), group=dist.group.WORLD)

    def all_gather(self, t: Tensor) -> list:
        """Every rank's `t` (same shape and dtype on every rank), in rank order: bytes moved, no arithmetic."""
        if self.tp == 1:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.tp)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return out

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """Σ over ranks in place, by the backend's own order: for gradients and the `native` control only,
        never on the contract's path."""
        if self.tp > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, result: str, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share this machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = fn(Mesh.from_env(), *args)
        if rank == 0:
            torch.save(out, result)
    finally:
        dist.destroy_process_group()


def spawn(world: int, fn: Callable, *args) -> Any:
    """Run fn(mesh, *args) in `world` processes (gloo, one tensor-parallel group) and return rank 0's result;
    world 1 runs it here, without torch.distributed. An exception in any rank raises here."""
    if world == 1:
        return fn(Mesh(), *args)
    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "rank0.pt")
        mp.spawn(_worker, args=(world, _free_port(), result, fn, args), nprocs=world, join=True)
        return torch.load(result, weights_only=False)
