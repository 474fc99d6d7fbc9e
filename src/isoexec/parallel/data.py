"""Data parallelism for the trainer: FSDP2 over a side's model groups, and the sequences cut over them.

Each of the `dp` model groups scores its own share of a call's sequences; a row's bits depend only on its own
sequence (the contract's batch invariance), so every share gives one process's rows, and the rows are then
all-gathered (pickled tensors: bytes) so every rank returns every sequence's, as one process does. The
parameters are sharded over the groups by `torch.distributed.fsdp.fully_shard` (each decoder layer, then the
root): a module's forward all-gathers its parameters (bytes), its backward reduce-scatters their gradients.
Gradients need only be correct, so the collective's sum is used there; the rows' gradients reach each group's
own rows only, so the reduction sums (divide factor 1) instead of averaging. Routed experts cut over the whole
side (EP = TP x DP) are left out of FSDP: no two groups hold the same ones.

FSDP runs a module's collectives once per forward call, so every group must run the same number of micro-batches:
`dp_micro_batches` packs as one process does, then splits or merges micro-batches until the count is a multiple
of `dp`, and deals them out in turn.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import Tensor

from .mesh import Mesh
from .plan import spread_over_side


def dp_micro_batches(lengths: list[int], max_tokens: int, dp: int, pack) -> list[list[list[int]]]:
    """Each group's micro-batches (sequence indices), the same number for every group: `pack(lengths, max_tokens)`'s
    micro-batches, the largest split in two (by sequences) until their count is a multiple of `dp`, or where too few
    can be split, one sequence a micro-batch with the shortest merged in pairs."""
    if len(lengths) < dp:
        raise ValueError(f"DP = {dp} needs at least {dp} sequences a call, got {len(lengths)}")
    batches = pack(lengths, max_tokens)
    missing = -len(batches) % dp
    tokens = lambda batch: sum(lengths[i] for i in batch)  # noqa: E731
    if missing <= sum(len(batch) - 1 for batch in batches):
        for _ in range(missing):
            largest = max((b for b in batches if len(b) > 1), key=tokens)
            batches.remove(largest)
            batches += [largest[: len(largest) // 2], largest[len(largest) // 2 :]]
    else:
        batches = [[i] for batch in batches for i in batch]
        for _ in range(len(batches) % dp):
            batches.sort(key=tokens)
            batches = [batches[0] + batches[1], *batches[2:]]
    batches.sort(key=lambda b: (-tokens(b), b))
    return [batches[rank::dp] for rank in range(dp)]


class _GatherSequences(torch.autograd.Function):
    """Every group's rows, in sequence order: the forward gathers them (pickled, so bytes), the backward gives each
    group's own rows their gradient."""

    @staticmethod
    def forward(ctx, mesh, count, indices, *mine):
        # Host copies cross: a pickled GPU tensor would come back on the sending rank's GPU.
        shares, device = [None] * mesh.dp, mine[0].device
        dist.all_gather_object(shares, [(i, t.detach().cpu()) for i, t in zip(indices, mine)], group=mesh.dp_mesh.get_group())
        out = [None] * count
        for share in shares:
            for i, t in share:
                out[i] = t.to(device)
        ctx.indices = indices
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, *(grads[i] for i in ctx.indices))


def gather_sequences(rows: dict[int, Tensor], count: int, mesh: Mesh) -> list[Tensor]:
    """Every sequence's rows from the groups' shares ({sequence index: rows} on each group)."""
    indices = sorted(rows)
    return list(_GatherSequences.apply(mesh, count, indices, *(rows[i] for i in indices)))


def gather_objects(mine: dict, count: int, mesh: Mesh) -> list:
    """Every sequence's value (no gradient) from the groups' shares (host values: they cross pickled)."""
    shares = [None] * mesh.dp
    dist.all_gather_object(shares, mine, group=mesh.dp_mesh.get_group())
    out = [None] * count
    for share in shares:
        for i, value in share.items():
            out[i] = value
    return out


def fully_shard_model(model, mesh: Mesh):
    """`model` (a rank's Decoder) with its parameters sharded over the data-parallel groups by FSDP2."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    # A layer returns its (hidden, residual) pair, views of its ops' outputs; FSDP warns that an in-place op on such a
    # view would lose its backward hook. The model's ops are all out of place (the gradient tests hold it to that).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    # A rank holding no vocabulary block has empty embedding and lm_head tensors, which FSDP cannot shard: they stay
    # as they are (there is nothing in them to shard or to reduce).
    left = {p for p in model.parameters() if p.numel() == 0}
    # Where EP spans the side, each group holds other experts than the others: nothing to shard, the gradient of every
    # group's pairs already summed into each expert's rank by the backward's all-to-all.
    left |= {p for name, p in model.named_parameters() if spread_over_side(name, mesh)}
    # The groups' gradients are summed in float32 and rounded once to the parameters' dtype (bfloat16 sums of more than
    # two groups would round at every add).
    precision = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh.dp_mesh, ignored_params=left, mp_policy=precision)
    fully_shard(model, mesh=mesh.dp_mesh, ignored_params=left, mp_policy=precision)
    register_fsdp_forward_method(model, "logprobs")  # called outside forward: its parameters unsharded too
    for module in (*model.model.layers, model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return model
