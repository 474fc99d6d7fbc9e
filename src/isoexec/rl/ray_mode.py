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

Ray is imported only here, and only when called: the in-process mode never needs it.
"""

import os

import torch

from .handshake import ensure_admitted
from .loop import Learner, RLRun, Rollout, setup


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
                 num_threads: int | None = None) -> RLRun:
    """Run `num_steps` (default `config.steps`) RL steps with the rollout and the learner as Ray actors.

    Joins the running Ray session, or `ray_address`, or starts a local cluster. The returned run holds
    the actors (the trained policy lives in the learner's), so it can keep stepping; the cluster stays
    up until `ray.shutdown()`.
    """
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False)
    run = ray_run(config, initial=initial, num_threads=num_threads)
    for _ in range(config.steps if num_steps is None else num_steps):
        run.run_step()
    return run
