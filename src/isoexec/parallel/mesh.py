"""One side's process layout (a mesh), and starting the processes of one.

A `Mesh` is what a rank knows of its side: its tensor-parallel size (attention heads, MLP columns and the
vocabulary cut over the ranks), its expert-parallel size (the routed experts cut over them), whether the
tokens are cut between the projections too (sequence parallel), its rank among them and the process group of
their collectives; and its data-parallel size (FSDP: `dp` copies of that model group, each scoring its own
sequences, the parameters sharded over the copies). TP and EP span the same ranks: a model group of `world`
processes has tp and ep each 1 or `world` (TP 1 with EP 2 replicates attention on two ranks that split the
experts). Or EP spans the whole side: with TP > 1 and DP > 1, EP = TP x DP cuts the routed experts over every
process of every group (SkyRL-IsoExec's trainer TP 4 / EP 8 on 8 GPUs is TP 4, DP 2, EP 8): the experts are then
not replicated over the groups, so FSDP leaves them alone, and each MoE layer exchanges (token, slot) pairs with
the other groups' ranks (`ep_mesh`). One process is the mesh with every size 1, and every collective is then the
identity.

`spawn` starts a side's world x dp processes on this machine with `torch.distributed` over gloo and returns what
global rank 0's function returned; `torchrun` sets the same environment, so `Mesh.from_env` serves both. Ranks
may share one GPU: their GPU tensors cross gloo through host memory. With `ISOEXEC_DIST_BACKEND=nccl` and the
device `cuda`, each rank takes a GPU of its own and the collectives run over NCCL (`backend_for`); the
collectives move bytes or take maxima, so the backend decides no bit of the contract's path.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor


def ep_spans_groups(tp: int, ep: int, dp: int) -> bool:
    """Whether EP cuts the experts over every process of a side of `dp` groups (EP = TP x DP, TP and DP above 1)
    rather than over one model group's."""
    return tp > 1 and dp > 1 and ep == tp * dp


def world_of(tp: int, ep: int, dp: int = 1) -> int:
    """The processes of a model group of TP `tp` and EP `ep` (a side has `dp` of them), or a ValueError naming what
    is wrong."""
    for name, value in (("tp", tp), ("ep", ep), ("dp", dp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if ep_spans_groups(tp, ep, dp):
        return tp
    world = max(tp, ep)
    if {tp, ep} - {1, world}:
        spanning = f", or EP = TP x DP = {tp * dp} (the experts over every group)" if tp > 1 and dp > 1 else ""
        raise ValueError(f"tp and ep span the same ranks: each is 1 or both are equal{spanning}, got tp = {tp}, ep = {ep}")
    return world


BACKENDS = ("gloo", "nccl")


def backend_for(device, ranks: int) -> str:
    """The collectives' backend for a side of `ranks` processes on `device`: `ISOEXEC_DIST_BACKEND` (gloo by default;
    nccl: a GPU a rank, which needs the device `cuda` and a GPU for every rank), or a ValueError saying why not."""
    choice = os.environ.get("ISOEXEC_DIST_BACKEND", "gloo")
    if choice not in BACKENDS:
        raise ValueError(f"ISOEXEC_DIST_BACKEND must be one of {', '.join(BACKENDS)}, got {choice!r}")
    if choice == "nccl" and ranks > 1:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if str(device) != "cuda" or gpus < ranks or not dist.is_nccl_available():
            raise ValueError(f"ISOEXEC_DIST_BACKEND=nccl puts each of a side's {ranks} processes on a GPU of its own: it needs "
                             f"--device cuda (got {device}) and {ranks} GPUs (this machine has {gpus})")
    return choice


def init_rank(rank: int, total: int, backend: str, port: int) -> None:
    """This process as rank `rank` of `total`, meeting the others at the store on this machine's `port` (`rendezvous`):
    over NCCL on GPU rank mod the GPUs, which `cuda` then names for everything the rank builds; over gloo on whatever
    device it is handed."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    if backend == "nccl":
        local = rank % torch.cuda.device_count()
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=total, device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=total)


@dataclass(frozen=True)
class Mesh:
    """A side's ranks, this process being `rank` of its model group: tensor-parallel size tp, expert-parallel size
    ep (each 1 or the group's size, or EP = TP x DP over the whole side), `group` the process group of their
    collectives; `dp` such groups side by side (data parallel), this process in the `dp_rank`-th, `dp_mesh` the
    device mesh over the groups (FSDP shards over it, the sequences are cut over it); `side_group` the process group
    of every rank of the side, where EP spans it; `host_group` a gloo twin of the dp group where the side runs on NCCL."""

    tp: int = 1
    ep: int = 1
    rank: int = 0
    group: Any = None
    sp: bool = False  # sequence parallel: the tensor-parallel ranks cut the tokens between the column- and row-parallel halves
    dp: int = 1
    dp_rank: int = 0
    dp_mesh: Any = None
    side_group: Any = None
    host_group: Any = None  # the dp group over gloo, for host values (`dp_host_group`); None: the dp group is gloo's

    @property
    def dp_host_group(self):
        """The process group over this rank's peers in the other model groups, for host values: the dp group itself
        over gloo, a gloo group over the same ranks where the side's collectives are NCCL's (an NCCL collective of a
        host value goes through the GPU, and reading it back waits for every kernel queued before it)."""
        return self.host_group if self.host_group is not None else self.dp_mesh.get_group()

    def __post_init__(self):
        world_of(self.tp, self.ep, self.dp)
        if not 0 <= self.rank < self.world or not 0 <= self.dp_rank < self.dp:
            raise ValueError(f"rank {self.rank!r} of {self.dp_rank!r} is outside a world of {self.world} x {self.dp}")
        if self.world * self.dp > 1 and self.group is None and self.dp_mesh is None and not dist.is_initialized():
            raise ValueError(f"a mesh of {self.world * self.dp} ranks needs torch.distributed initialised (spawn, or torchrun)")

    @property
    def world(self) -> int:
        """The model group's processes (tensor and expert parallel)."""
        return world_of(self.tp, self.ep, self.dp)

    @property
    def ep_spans_groups(self) -> bool:
        """Whether the routed experts are cut over every rank of the side (EP = TP x DP) instead of the group's."""
        return ep_spans_groups(self.tp, self.ep, self.dp)

    @property
    def shard_ranks(self) -> int:
        """The ranks the whole model's weights are cut over: the model group's, or the side's where EP spans it (a
        group then holds only its experts)."""
        return self.world * self.dp if self.ep_spans_groups else self.world

    @property
    def shard_rank(self) -> int:
        """This process among `shard_ranks`: the side's ranks in order, group after group."""
        return self.dp_rank * self.world + self.rank if self.ep_spans_groups else self.rank

    @property
    def shard_group(self):
        """The process group of the `shard_ranks`."""
        return self.side_group if self.ep_spans_groups else self.group

    @property
    def ep_rank(self) -> int:
        """This process among the EP ranks (the rank whose experts `plan.experts_of` gives it): its shard rank."""
        return self.shard_rank

    def ep_mesh(self) -> "Mesh":
        """The mesh an MoE layer's pairs are exchanged over: this one, or, where EP spans the side, every rank of the
        side as one group of EP ranks (tp 1), this process its `ep_rank`."""
        if not self.ep_spans_groups:
            return self
        return Mesh(tp=1, ep=self.ep, rank=self.ep_rank, group=self.side_group)

    def sizes(self) -> dict:
        """Every axis's size, as a fingerprint carries them."""
        return {"tp": self.tp, "ep": self.ep, "sp": self.sp, "dp": self.dp}

    @classmethod
    def from_env(cls, tp: int | None = None, ep: int = 1, sp: bool = False, dp: int = 1) -> "Mesh":
        """The world torch.distributed was initialised with: `dp` model groups of consecutive ranks (all of it, tensor
        parallel, unless `tp` says otherwise), expert-parallel size `ep`, sequence parallel or not."""
        if not dist.is_initialized():
            return cls()
        total = dist.get_world_size()
        if total % dp:
            raise ValueError(f"DP = {dp} does not divide the world's {total} processes")
        world = total // dp
        tp = world if tp is None else tp
        if world_of(tp, ep, dp) != world:
            raise ValueError(f"TP = {tp}, EP = {ep}, DP = {dp} make model groups of {world_of(tp, ep, dp)} processes; "
                             f"the world has {total}")
        if dp == 1:
            return cls(tp=tp, ep=ep, rank=dist.get_rank(), group=dist.group.WORLD, sp=sp)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda" if dist.get_backend() == "nccl" else "cpu", (dp, world), mesh_dim_names=("dp", "model"))
        side = dist.group.WORLD if ep_spans_groups(tp, ep, dp) else None  # rank d * world + r is group d's rank r
        rank, host = mesh.get_local_rank("model"), None
        if dist.get_backend() == "nccl":  # every rank makes every group, in the same order
            for r in range(world):
                group = dist.new_group([d * world + r for d in range(dp)], backend="gloo")
                host = group if r == rank else host
        return cls(tp=tp, ep=ep, rank=rank, group=mesh.get_group("model"), sp=sp, dp=dp, dp_rank=mesh.get_local_rank("dp"),
                   dp_mesh=mesh["dp"], side_group=side, host_group=host)

    def _staged(self, t: Tensor) -> bool:
        """Whether `t` goes through another device's memory: a GPU tensor on gloo (which carries CPU tensors in
        every collective; ranks sharing one GPU cannot use NCCL) or a CPU tensor on NCCL. A copy each way, so the
        bits are the tensor's."""
        return (t.device.type == "cpu") == (dist.get_backend(self.group) == "nccl")

    def _carried(self, t: Tensor) -> Tensor:
        """`t` where the backend carries it (see `_staged`)."""
        if not self._staged(t):
            return t
        return t.cuda() if t.device.type == "cpu" else t.cpu()

    def all_gather(self, t: Tensor) -> list:
        """Every rank's `t` (same shape and dtype on every rank), in rank order: bytes moved, no arithmetic."""
        if self.world == 1:
            return [t]
        staged = self._staged(t)
        sent = self._carried(t).contiguous()
        out = [torch.empty_like(sent) for _ in range(self.world)]
        dist.all_gather(out, sent, group=self.group)
        return [o.to(t.device) for o in out] if staged else out

    def all_to_all(self, t: Tensor, sent: list[int], received: list[int]) -> Tensor:
        """`t`'s rows to the ranks (the first `sent[0]` to rank 0, the next `sent[1]` to rank 1, …), and the rows
        every rank sent this one (`received[r]` from rank r), in rank order: bytes moved, no arithmetic."""
        if self.world == 1:
            return t
        staged = self._staged(t)
        source = self._carried(t).contiguous()
        out = source.new_empty((sum(received), *t.shape[1:]))
        dist.all_to_all_single(out, source, output_split_sizes=received, input_split_sizes=sent, group=self.group)
        return out.to(t.device) if staged else out

    def _all_reduce(self, t: Tensor, op) -> Tensor:
        if self.world == 1:
            return t
        if self._staged(t):
            carried = self._carried(t)
            dist.all_reduce(carried, op=op, group=self.group)
            return t.copy_(carried)
        dist.all_reduce(t, op=op, group=self.group)
        return t

    def all_reduce_max(self, t: Tensor) -> Tensor:
        """The elementwise maximum over ranks, in place (exact in any order, up to which of ±0.0 wins)."""
        return self._all_reduce(t, dist.ReduceOp.MAX)

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """Σ over ranks in place, by the backend's own order: for gradients and the `native` control only,
        never on the contract's path."""
        return self._all_reduce(t, dist.ReduceOp.SUM)


def rendezvous() -> dist.TCPStore:
    """The store a side's ranks meet at (`init_rank`), served by this process on a port the system picks and this
    process keeps: a port found free and bound only later by rank 0 could be taken in between by another group's
    connections (two test workers' gloo groups did, EADDRINUSE). Keep it until the ranks are done."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


# What a rank's process has imported before it starts (the forkserver's preload): the seconds a fresh
# interpreter spends importing torch and isoexec, paid once per caller instead of once per rank.
PRELOAD = ["torch", "torch.distributed", "isoexec.parallel", "isoexec.trainer", "isoexec.engine"]


def start_context():
    """The multiprocessing context ranks start in: forked from a server that has imported `PRELOAD` (a process
    without threads or CUDA, so forking it is safe), where the platform has one; else spawned afresh. A forked
    rank starts from the server's environment and directory, so it takes the caller's (`caller_state`,
    `adopt`); what the preloaded modules read from the environment on import (TRITON_INTERPRET, say) they read
    once, when the server started: at a process's first parallel call."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def caller_state() -> tuple[dict, str]:
    return dict(os.environ), os.getcwd()


def adopt(state: tuple[dict, str]) -> None:
    """Take the caller's environment and working directory (see `start_context`)."""
    environ, cwd = state
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)


def _worker(rank: int, total: int, sizes: dict, port: int, result: str, fn: Callable, args: tuple, state: tuple, backend: str) -> None:
    adopt(state)
    torch.set_num_threads(1)  # the ranks share this machine's cores
    init_rank(rank, total, backend, port)
    try:
        out = fn(Mesh.from_env(**sizes), *args)
        if rank == 0:
            torch.save(out, result)
    finally:
        dist.destroy_process_group()


def spawn(tp: int, fn: Callable, *args, ep: int = 1, sp: bool = False, dp: int = 1, device=None) -> Any:
    """Run fn(mesh, *args) on a side of TP `tp`, EP `ep`, sequence parallelism `sp` and DP `dp`: max(tp, ep) x dp
    processes (over `backend_for(device, ...)`), and return global rank 0's result; one process runs it here,
    without torch.distributed. An exception in any rank raises here."""
    total = world_of(tp, ep, dp) * dp
    backend = backend_for(device, total)
    if total == 1:
        return fn(Mesh(), *args)
    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "rank0.pt")
        sizes = {"tp": tp, "ep": ep, "sp": sp, "dp": dp}
        store = rendezvous()
        mp.start_processes(_worker, args=(total, sizes, store.port, result, fn, args, caller_state(), backend), nprocs=total, join=True,
                           start_method=start_context().get_start_method())
        return torch.load(result, weights_only=False)
