"""A side's processes kept alive across calls: the RL loop's trainer and engine at their own layouts.

`RankGroup(factory, *args, tp=, ep=, sp=, dp=, device=)` starts the side's processes (this machine; gloo, or NCCL
by `mesh.backend_for`), each building
its object as factory(mesh, *args); `call(method, *args)` runs the method on every rank (they run the same
collectives) and returns rank 0's result. Arguments and results travel pickled by value. An exception in any
rank, or a rank that dies, stops the whole group (a rank left waiting in a collective would otherwise hang) and
raises here: the rank's exception where it pickles, else a RankGroupError with its traceback.
"""

from __future__ import annotations

import pickle
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable

import torch
import torch.distributed as dist

from .mesh import Mesh, adopt, backend_for, caller_state, init_rank, rendezvous, start_context, world_of


class RankGroupError(RuntimeError):
    """A rank of a group raised, or died."""


def _serve(rank: int, total: int, sizes: dict, port: int, conn, factory: Callable, args: bytes, state: tuple, backend: str) -> None:
    adopt(state)
    torch.set_num_threads(1)  # the ranks share this machine's cores
    init_rank(rank, total, backend, port)

    def reply(value: Any) -> None:
        conn.send_bytes(pickle.dumps((True, value if rank == 0 else None)))

    def fail(error: Exception) -> None:
        try:  # the exception itself where it pickles (GateError does), for the caller to catch by type
            conn.send_bytes(pickle.dumps((False, (error, traceback.format_exc()))))
        except Exception:
            conn.send_bytes(pickle.dumps((False, (None, traceback.format_exc()))))

    try:
        try:
            side = factory(Mesh.from_env(**sizes), *pickle.loads(args))
        except Exception as error:
            fail(error)
            return
        reply(None)
        while (message := pickle.loads(conn.recv_bytes())) is not None:
            method, call_args = message
            try:
                reply(getattr(side, method)(*call_args))
            except Exception as error:
                fail(error)
    finally:
        dist.destroy_process_group()


class RankGroup:
    def __init__(self, factory: Callable, *args, tp: int = 1, ep: int = 1, sp: bool = False, dp: int = 1, device=None):
        total = world_of(tp, ep, dp) * dp
        backend = backend_for(device, total)
        context = start_context()
        self.store = rendezvous()  # kept while the ranks live
        sizes, port, payload = {"tp": tp, "ep": ep, "sp": sp, "dp": dp}, self.store.port, pickle.dumps(args)
        self.pipes, self.processes = [], []
        for rank in range(total):
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(rank, total, sizes, port, child, factory, payload, caller_state(), backend),
                                      daemon=True)
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)
        self._replies()

    def call(self, method: str, *args) -> Any:
        """method(*args) on every rank's object; rank 0's result."""
        message = pickle.dumps((method, args))
        for pipe in self.pipes:
            pipe.send_bytes(message)
        return self._replies()

    def _replies(self) -> Any:
        replies, pending = {}, dict(enumerate(self.pipes))
        while pending:
            ready = wait([*pending.values(), *(p.sentinel for p in self.processes)])
            for rank, pipe in list(pending.items()):
                if pipe in ready:
                    try:
                        ok, value = pickle.loads(pipe.recv_bytes())
                    except EOFError:  # the rank died; its exit code is read below
                        continue
                    if not ok:
                        self.close(force=True)
                        error, trace = value
                        where = RankGroupError(f"rank {rank} raised:\n{trace}")
                        if error is None:
                            raise where
                        raise error from where
                    replies[rank] = value
                    del pending[rank]
            dead = [rank for rank in pending if not self.processes[rank].is_alive()]
            if dead:
                self.close(force=True)
                raise RankGroupError(f"rank {dead[0]} exited (code {self.processes[dead[0]].exitcode})")
        return replies[0]

    def close(self, force: bool = False) -> None:
        for pipe, process in zip(self.pipes, self.processes):
            if process.is_alive() and not force:
                try:
                    pipe.send_bytes(pickle.dumps(None))
                except OSError:
                    pass
        for process in self.processes:
            process.join(timeout=None if not force else 0)
            if process.is_alive():
                process.terminate()
                process.join()
        self.pipes, self.processes, self.store = [], [], None
