"""The RL loop with the trainer and the engine each at its own parallel layout (TP, EP, SP; DP for the trainer).

`start_run(config)` gives an in-process `RLRun` when the config asks for no parallelism; otherwise each side is a
`parallel.RankGroup` of processes on this machine (gloo), and `RLRun` drives two adapters that call them, so the
loop is unchanged. The warm-up runs once, here, and both sides start from its weights; without a warm-up, random
weights are drawn by every rank for its own shard (`parallel.random_shard`), never whole in one process. Every sync sends the
whole model's weights a bucket at a time, put together from the trainer's shards, from the trainer's rank 0 to the
engine's ranks directly (`transfer.py`; through this process only for Ray's actors or vLLM); each engine rank cuts
its own shards from them, and the engine puts its shards together again to recompute the digest, which must be
the trainer's: the whole logical weights are equal on both sides every step. Each side's rank 0 sends its
fingerprint, carrying its sizes, to the handshake; each rank was admitted at the shapes it runs (its shard's).
"""

from __future__ import annotations

import copy
import functools

import torch.distributed as dist

from ..parallel import check
from ..parallel.group import RankGroup
from .handshake import ensure_admitted
from . import transfer
from .loop import Learner, RLRun, Rollout, initial_model, local_rollout, setup
from .sync import WeightSyncError
from .warmup import warmup


def _admitted(side, mesh):
    """Admit the rank's shapes, one rank at a time (the battery writes the machine's records)."""
    for rank in range(dist.get_world_size()):
        if rank == dist.get_rank():
            ensure_admitted(side.contract, str(side.device), spec=side.rank_spec, binding=side.binding)
        dist.barrier()
    return side


def _learner(mesh, config, initial):
    return _admitted(Learner(config, initial, mesh), mesh)


def _rollout(mesh, config):
    return _admitted(Rollout(config, mesh), mesh)


class _Group:
    """A side's processes, called as the in-process side is."""

    def __init__(self, group: RankGroup, contract):
        self.group, self.contract = group, contract

    def fingerprint(self) -> dict:
        return self.group.call("fingerprint")

    def close(self) -> None:
        self.group.close()


class GroupRollout(_Group):
    def generate(self, prompts, params):
        return self.group.call("generate", prompts, params)

    def load_weights(self, tensors, digest: str) -> str:
        return self.group.call("load_weights", tensors, digest)


class GroupLearner(_Group):
    def weights(self):
        return self.group.call("weights")

    def send_weights(self, rollout: GroupRollout, spec) -> str:
        """The weights from this side's ranks to the engine's, a bucket at a time (`transfer.py`): this process
        passes on where each bucket is, never the weights."""
        for names in transfer.buckets(spec):
            rollout.group.call("receive_bucket", self.group.call("send_bucket", names))
        sent, received = self.group.call("finish_send"), rollout.group.call("finish_receive")
        if sent != received:
            raise WeightSyncError(f"weights arrived corrupted: sender {sent}, receiver {received}")
        return received

    def update(self, kept, advantages, step: int) -> dict:
        return self.group.call("update", kept, advantages, step)

    def checkpoint_state(self) -> dict:
        return self.group.call("checkpoint_state")

    def load_checkpoint_state(self, masters: dict, optimizer: dict) -> None:
        self.group.call("load_checkpoint_state", masters, optimizer)


def check_layouts(config) -> None:
    """Refuse, in one line naming the side, a layout the model or the contract cannot be cut into."""
    _, spec, contract = setup(config)
    for side in ("trainer", "engine"):
        sizes = config.layout(side)
        try:
            check(spec, contract, sizes["tp"], sizes["ep"], sizes["sp"], sizes.get("dp", 1))
        except ValueError as error:
            raise ValueError(f"{side} layout: {error}") from None


def start_run(config, *, initial=None, group=RankGroup, **options) -> RLRun:
    """An RLRun at the config's layouts: in this process, or each side a `group` of processes of its own
    (`RankGroup`, or `ray_mode.RayRankGroup` with its `options`); close() the run to stop them."""
    if not config.parallel:
        return RLRun(config, initial=initial)
    check_layouts(config)
    task, spec, contract = setup(config)
    ensure_admitted(contract, config.device, spec=spec)
    if initial is not None or config.num_warmup_steps or config.model_is_checkpoint:
        initial = copy.deepcopy(initial) if initial is not None else warmup(initial_model(config, spec), task, config)
        initial = initial.cpu()  # pickled to the trainer's processes, each moving its shard to config.device
    # else each rank draws its own shard of the seeded random weights (`loop._initial_rank_model`).
    learner = GroupLearner(group(_learner, config, initial, **config.layout("trainer"), device=config.device, **options), contract)
    try:
        # vLLM runs in this process (its engine core and worker), unsharded, whatever the trainer's layout.
        if config.engine == "vllm":
            rollout = local_rollout(config)
        else:
            rollout = GroupRollout(group(_rollout, config, **config.layout("engine"), device=config.device, **options), contract)
    except BaseException:
        learner.close()
        raise
    # Local processes pass the weights between them; Ray's actors may sit on other hosts, so theirs go through here.
    direct = group is RankGroup and isinstance(rollout, GroupRollout)
    return RLRun(config, rollout=rollout, learner=learner, send_weights=functools.partial(learner.send_weights, rollout, spec) if direct else None)
