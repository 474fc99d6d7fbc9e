"""One side's process layout (a mesh), and starting the processes of one.

A `Mesh` is what a rank knows of its side: its tensor-parallel size (attention heads and MLP columns cut over
the ranks), its expert-parallel size (the routed experts cut over them), its rank, and the process group its
collectives run on (None for one process: every collective is then the identity). Both axes span the same
ranks: a side of `world` processes has tp and ep each 1 or `world` (TP 1 with EP 2 replicates attention on
two ranks that split the experts). `spawn`
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


def world_of(tp: int, ep: int) -> int:
    """The processes of a side of TP `tp` and EP `ep`, or a ValueError naming what is wrong."""
    for name, value in (("tp", tp), ("ep", ep)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    world = max(tp, ep)
    if {tp, ep} - {1, world}:
        raise ValueError(f"tp and ep span the same ranks: each is 1 or both are equal, got tp = {tp}, ep = {ep}")
    return world


@dataclass(frozen=True)
class Mesh:
    """A side's ranks, this process being `rank`: tensor-parallel size tp, expert-parallel size ep (each 1 or
    the world's size); `group` the process group of their collectives."""

    tp: int = 1
    ep: int = 1
    rank: int = 0
    group: Any = None
    sp: bool = False  # sequence parallel: the tensor-parallel ranks cut the tokens between the column- and row-parallel halves

    def __post_init__(self):
        world_of(self.tp, self.ep)
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank!r} is outside a world of {self.world}")
        if self.world > 1 and self.group is None and not dist.is_initialized():
            raise ValueError(f"a mesh of {self.world} ranks needs torch.distributed initialised (spawn, or torchrun)")

    @property
    def world(self) -> int:
        return max(self.tp, self.ep)

    @classmethod
    def from_env(cls, tp: int | None = None, ep: int = 1, sp: bool = False) -> "Mesh":
        """The world torch.distributed was initialised with, as one group: tensor-parallel over all of it unless
        `tp` says otherwise, expert-parallel size `ep`, sequence parallel or not."""
        if not dist.is_initialized():
            return cls()
        world = dist.get_world_size()
        return cls(tp=world if tp is None else tp, ep=ep, rank=dist.get_rank(), group=dist.group.WORLD, sp=sp)

    def all_gather(self, t: Tensor) -> list:
        """Every rank's `t` (same shape and dtype on every rank), in rank order: bytes moved, no arithmetic."""
        if self.world == 1:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return out

    def all_reduce_max(self, t: Tensor) -> Tensor:
        """The elementwise maximum over ranks, in place (exact in any order, up to which of ±0.0 wins)."""
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """Σ over ranks in place, by the backend's own order: for gradients and the `native` control only,
        never on the contract's path."""
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, tp: int, ep: int, sp: bool, port: int, result: str, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share this machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out = fn(Mesh.from_env(tp=tp, ep=ep, sp=sp), *args)
        if rank == 0:
            torch.save(out, result)
    finally:
        dist.destroy_process_group()


def spawn(tp: int, fn: Callable, *args, ep: int = 1, sp: bool = False) -> Any:
    """Run fn(mesh, *args) on a side of TP `tp`, EP `ep` and sequence parallelism `sp`: max(tp, ep) processes
    (gloo), and return rank 0's result; one process runs it here, without torch.distributed. An exception in
    any rank raises here."""
    world = world_of(tp, ep)
    if world == 1:
        return fn(Mesh(), *args)
    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "rank0.pt")
        mp.spawn(_worker, args=(world, tp, ep, sp, _free_port(), result, fn, args), nprocs=world, join=True)
        return torch.load(result, weights_only=False)
