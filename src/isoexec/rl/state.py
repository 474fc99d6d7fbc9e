"""A learner's training state as one process holds it, put together from a parallel side's shards and cut back into
them: what a checkpoint stores, so that one file serves every layout.

The policy's weights, the float32 masters (`precision.py`) and AdamW's moments are each whole tensors by parameter
name, gathered from the shards by `parallel.weights.unshard_state` (on the side's first rank) and cut again by
`plan.shard_of`, then by FSDP's rows where data parallelism shards the parameter (a DTensor over the groups). The
optimiser's state keeps torch's layout (`state_dict()`: per parameter index, in the policy's parameter order, which
is the same at every layout); its per-parameter step counts are equal, as every parameter steps every update
(`Learner.update` gives a parameter without a gradient zeros, as one process's whole expert tensor would have).
"""

import torch
from torch import Tensor

from ..parallel.plan import shard_of
from ..parallel.weights import dp_rows, unshard_state
from .sync import state_digest

MOMENTS = ("exp_avg", "exp_avg_sq")


def _host(value):
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _host(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_host(v) for v in value]
    return value


def whole_state(learner, folded: bool) -> dict | None:
    """{"policy", "masters", "optimizer", "weights_sha256"}: host tensors, each whole; on a parallel side only its
    first rank returns them (the others None). `folded`: the digest's form (`sync.state_digest`)."""
    stepped = learner.master if learner.master is not None else learner.policy
    names = [name for name, _ in stepped.named_parameters()]
    optimizer = learner.optimizer.state_dict()
    masters = {} if learner.master is None else {name: p.detach() for name, p in learner.master.named_parameters()}
    if not learner.parallel:  # the digest over the policy where it is, as the run's syncs take it
        policy = learner.policy.state_dict()
        return {"policy": _host(policy), "masters": _host(masters), "optimizer": _host(optimizer), "weights_sha256": state_digest(policy, folded)}
    spec, contract, mesh = learner.spec, learner.contract, learner.mesh
    gather = lambda tensors: unshard_state(tensors, spec, contract, mesh, first_only=True)  # noqa: E731
    policy = gather(learner.policy.state_dict())
    masters = gather(masters) if masters else {}
    moments = {}  # none before the first update
    if optimizer["state"]:
        moments = {key: gather({names[i]: state[key] for i, state in optimizer["state"].items()}) for key in MOMENTS}
    if not policy:  # not the side's first rank
        return None
    state = {i: {"step": _host(s["step"]), **{key: moments[key][names[i]] for key in MOMENTS}} for i, s in optimizer["state"].items()}
    return {"policy": _host(policy), "masters": _host(masters), "optimizer": _host({"state": state, "param_groups": optimizer["param_groups"]}),
            "weights_sha256": state_digest(policy, folded)}


def _local(name: str, whole: Tensor, like: Tensor, learner) -> Tensor:
    """This rank's part of the whole tensor of parameter `name`, shaped as `like` (a DTensor over the data-parallel
    groups where FSDP shards the parameter) and where `like` is."""
    part = shard_of(name, whole, learner.spec, learner.contract, learner.mesh)
    if not hasattr(like, "to_local"):
        return part.to(like.device, like.dtype)
    from torch.distributed.tensor import DTensor

    rows = part[dp_rows(part.shape[0], learner.mesh)]
    return DTensor.from_local(rows.to(like.to_local().device, like.dtype), like.device_mesh, like.placements, shape=like.shape,
                              stride=like.stride())


def load_whole_state(learner, masters: dict, optimizer: dict) -> None:
    """Cut the whole masters and optimiser state (`whole_state`'s) into this rank's and load them (the policy's
    weights come through the run's start, as its initial weights)."""
    stepped = learner.master if learner.master is not None else learner.policy
    params = list(stepped.named_parameters())
    with torch.no_grad():
        for name, p in learner.master.named_parameters() if learner.master is not None else ():
            local = _local(name, masters[name], p, learner)
            (p.to_local() if hasattr(p, "to_local") else p).copy_(local.to_local() if hasattr(local, "to_local") else local)
    state = {i: {"step": s["step"], **{key: _local(params[i][0], s[key], params[i][1], learner) for key in MOMENTS}}
             for i, s in optimizer["state"].items()}
    learner.optimizer.load_state_dict({"state": state, "param_groups": optimizer["param_groups"]})
