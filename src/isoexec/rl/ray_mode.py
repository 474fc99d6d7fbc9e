"""The RL loop with the engine and the trainer as Ray actors, each in its own worker process.

`run_with_ray(config)` starts (or joins) a Ray cluster, hosts one `Rollout` and one `Learner` in
actors, and hands `RLRun` two adapters that call them synchronously; the loop itself is unchanged.
The contract handshake then compares fingerprints that each worker process computed for itself, and
the weights travel learner → object store → rollout without passing through the driver (the driver
holds only an object reference and the sender's digest); the rollout recomputes the digest on arrival
and refuses weights that do not match.

A Ray run gives bitwise the results of an in-process run of the same config when both compute with
the same number of CPU threads. The count has to be pinned because Ray starts workers with
OMP_NUM_THREADS=1 while the driver typically uses every core, and the split of a CPU matmul's
reduction across threads (the backward pass, the native-path warm-up) can change its bits. So each
actor calls `torch.set_num_threads(num_threads)` before building its side, and `num_threads`
defaults to the driver's own count, which an in-process run in the same driver would use.

A config with a parallel side (`RLConfig.parallel`) runs each side as a `RayRankGroup`: one actor per rank,
the side's actors reserved together in a placement group (PACK: on as few nodes as fit, since their
collectives are gloo's), torch.distributed initialised among them with rank 0's node as the rendezvous, and
the side driven through `parallel_mode`'s adapters, as its processes are on one machine. Each rank computes on
one thread, as `parallel.RankGroup`'s processes do, so the two give the same bits.

Ray is imported only here, and only when called: the in-process mode never needs it.
"""

import os

import torch
import torch.distributed as dist

from ..parallel.group import RankGroupError
from ..parallel.mesh import Mesh, world_of
from .handshake import ensure_admitted
from .loop import Learner, RLRun, Rollout, setup
from .parallel_mode import start_run


def _ray():
    try:
        import ray
    except ImportError as error:
        raise ImportError("Ray mode needs Ray: pip install ray") from error
    return ray


class _Host:
    """One side (a `Rollout` or a `Learner`) living in a Ray worker process."""

    def __init__(self, side: type, num_threads: int, *args):
        torch.set_num_threads(num_threads)
        self.side = side(*args)
        # Admission records are per machine: on the driver's host this is a lookup, elsewhere it
        # runs the battery, as the fingerprint this process sends must be covered where it runs.
        ensure_admitted(self.side.contract, spec=self.side.spec, binding=self.side.binding)

    def pid(self) -> int:
        return os.getpid()

    def num_threads(self) -> int:
        return torch.get_num_threads()

    def call(self, method: str, *args):
        return getattr(self.side, method)(*args)


class _Remote:
    """A side behind an actor handle, called synchronously so `RLRun` cannot tell it from a local one."""

    def __init__(self, handle):
        self.handle = handle

    def _call(self, method: str, *args):
        return _ray().get(self.handle.call.remote(method, *args))

    def pid(self) -> int:
        return _ray().get(self.handle.pid.remote())

    def num_threads(self) -> int:
        return _ray().get(self.handle.num_threads.remote())

    def fingerprint(self) -> dict:
        return self._call("fingerprint")


class RemoteRollout(_Remote):
    def generate(self, prompts, params):
        return self._call("generate", prompts, params)

    def load_weights(self, tensors, digest: str) -> str:
        """`tensors` may be an object reference: Ray resolves it in the rollout's process."""
        return self._call("load_weights", tensors, digest)


class RemoteLearner(_Remote):
    def weights(self):
        """(an object reference to the tensors, the sender's digest): the bytes stay in the object store."""
        tensors, digest = self.handle.call.options(num_returns=2).remote("weights")
        return tensors, _ray().get(digest)

    def update(self, kept, advantages: torch.Tensor, step: int) -> dict:
        return self._call("update", kept, advantages, step)


class _Rank:
    """One rank of a side, in a Ray worker process."""

    def address(self) -> tuple[str, int]:
        """Where rank 0 serves the store the others meet at (called on rank 0 only). The store keeps its port from
        here on: a port found free and bound only later could be taken in between (`parallel.mesh.rendezvous`)."""
        self.store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False)
        return _ray().util.get_node_ip_address(), self.store.port

    def start(self, rank: int, total: int, sizes: dict, address: tuple[str, int], factory, args) -> None:
        torch.set_num_threads(1)  # as parallel.RankGroup's ranks: the same bits
        self.rank = rank
        store = self.store if rank == 0 else dist.TCPStore(address[0], address[1], is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=total)
        self.side = factory(Mesh.from_env(**sizes), *args)

    def pid(self) -> int:
        return os.getpid()

    def call(self, method: str, *args):
        out = getattr(self.side, method)(*args)
        return out if self.rank == 0 else None

    def stop(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class RayRankGroup:
    """`parallel.RankGroup`'s interface over Ray actors: `call(method, *args)` runs the method on every rank and
    returns rank 0's result; an exception in any rank stops the group (the others may be waiting in a
    collective) and is raised here."""

    def __init__(self, factory, *args, tp: int = 1, ep: int = 1, sp: bool = False, dp: int = 1, cpus_per_rank: float = 1.0,
                 timeout_s: float = 120.0, device: str = "cpu"):
        if str(device) != "cpu":
            raise ValueError("Ray mode reserves CPUs for its ranks only: run it with device cpu")
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        total = world_of(tp, ep, dp) * dp
        self._remove = remove_placement_group
        self.group = placement_group([{"CPU": cpus_per_rank}] * total, strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.group)
            raise RankGroupError(f"the Ray cluster did not give {total} bundles of {cpus_per_rank} CPU within {timeout_s:.0f} s "
                                 "(ray.cluster_resources() says what it has)") from None
        env = {"ISOEXEC_HOME": os.environ["ISOEXEC_HOME"]} if "ISOEXEC_HOME" in os.environ else {}
        actor = ray.remote(_Rank)
        self.ranks = [actor.options(num_cpus=cpus_per_rank, runtime_env={"env_vars": env},
                                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=rank)).remote()
                      for rank in range(total)]
        address = ray.get(self.ranks[0].address.remote())
        sizes = {"tp": tp, "ep": ep, "sp": sp, "dp": dp}
        self._wait([r.start.remote(rank, total, sizes, address, factory, args) for rank, r in enumerate(self.ranks)])

    def _wait(self, refs: list):
        ray = _ray()
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except Exception:
                self.close(force=True)
                raise
        return ray.get(refs[0])

    def call(self, method: str, *args):
        return self._wait([r.call.remote(method, *args) for r in self.ranks])

    def pids(self) -> list[int]:
        return _ray().get([r.pid.remote() for r in self.ranks])

    def close(self, force: bool = False) -> None:
        ray = _ray()
        if not force:
            ray.get([r.stop.remote() for r in self.ranks])
        for r in self.ranks:
            ray.kill(r)
        if self.ranks:
            self._remove(self.group)
        self.ranks = []


def ray_parallel_run(config, *, initial=None, cpus_per_rank: float = 1.0) -> RLRun:
    """An `RLRun` whose sides are `RayRankGroup`s at the config's layouts; Ray must already be initialised.
    cpus_per_rank: the CPUs each rank's actor reserves."""
    if not _ray().is_initialized():
        raise RuntimeError("ray_parallel_run needs ray.init() first (or use run_with_ray)")
    return start_run(config, initial=initial, group=RayRankGroup, cpus_per_rank=cpus_per_rank)


def ray_run(config, *, initial=None, num_threads: int | None = None) -> RLRun:
    """An `RLRun` whose rollout and learner are Ray actors; Ray must already be initialised.

    num_threads: CPU threads each actor computes with; defaults to this process's torch count, so the
    run matches an in-process run started here (see the module docstring).
    """
    ray = _ray()
    if not ray.is_initialized():
        raise RuntimeError("ray_run needs ray.init() first (or use run_with_ray)")
    num_threads = num_threads or torch.get_num_threads()
    # Admit once here before the actors look the records up, so two processes never run the battery at once.
    _, spec, contract = setup(config)
    ensure_admitted(contract, spec=spec)
    # Workers get the cluster's environment, not the driver's: pass on where the admission records are.
    env = {"ISOEXEC_HOME": os.environ["ISOEXEC_HOME"]} if "ISOEXEC_HOME" in os.environ else {}
    host = ray.remote(_Host).options(runtime_env={"env_vars": env})
    learner = RemoteLearner(host.remote(Learner, num_threads, config, initial))
    rollout = RemoteRollout(host.remote(Rollout, num_threads, config))
    return RLRun(config, rollout=rollout, learner=learner)


def run_with_ray(config, *, num_steps: int | None = None, initial=None, ray_address: str | None = None,
                 num_threads: int | None = None, cpus_per_rank: float = 1.0) -> RLRun:
    """Run `num_steps` (default `config.steps`) RL steps with the rollout and the learner as Ray actors (a parallel
    side as a group of them, one a rank; `close()` the run to stop them).

    Joins the running Ray session, or `ray_address`, or starts a local cluster. The returned run holds
    the actors (the trained policy lives in the learner's), so it can keep stepping; the cluster stays
    up until `ray.shutdown()`.
    """
    if config.device != "cpu":
        raise ValueError("Ray mode reserves CPUs for its actors only: run it with device cpu")
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False)
    run = ray_parallel_run(config, initial=initial, cpus_per_rank=cpus_per_rank) if config.parallel else ray_run(config, initial=initial, num_threads=num_threads)
    for _ in range(config.steps if num_steps is None else num_steps):
        run.run_step()
    return run
