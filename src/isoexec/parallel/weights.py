"""A side's weights as one model: the whole logical weights put together from every rank's shards (weight sync,
its SHA-256), and the gradients' norm over them (clipping).

Where each element of a rank's shard sits in the whole weight is found by cutting an index tensor the way the
weight is cut (`plan.shard_of` on arange), so the inverse of every cut — heads, leaves, vocabulary blocks,
experts, replication — follows from the one definition of the cuts. An element several ranks hold (replicated
weights, key/value heads copied where TP exceeds them) counts once in the norm. The shards are those of the model
group's ranks, or of every rank of the side where EP spans it (`Mesh.shard_ranks`: the groups' other experts).

A cut depends on the weight's layer only through the layer's mixer or feed-forward spec, so it is found once per
distinct one (`_cut`), not once per layer and sync: forty layers of 256 experts would otherwise build an index of
every element of the model on every sync. A cut that is one run of the whole weight (a rank's experts, a replicated
weight) is kept as a slice; only the others keep their positions.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.distributed as dist
from torch import Tensor

from ..model import Decoder, ModelSpec
from .mesh import Mesh
from .plan import num_leaves, shard_of, spread_over_side, vocab_block


def _whole(t: Tensor) -> Tensor:
    """A tensor FSDP shards over the data-parallel groups (a DTensor), whole on every rank; others as they are."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def weight_shapes(spec: ModelSpec) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Every weight of the whole model `spec` describes: its shape and dtype (on the meta device: nothing allocated)."""
    return dict(_shapes(spec))


@lru_cache(maxsize=8)
def _shapes(spec: ModelSpec) -> dict[str, tuple[torch.Size, torch.dtype]]:
    with torch.device("meta"):
        return {name: (t.shape, t.dtype) for name, t in Decoder(spec).state_dict().items()}


def _rank_mesh(mesh: Mesh, rank: int) -> Mesh:
    """The mesh of shard rank `rank` of `mesh`'s side (`Mesh.shard_rank`), for its cuts only."""
    if mesh.ep_spans_groups:
        return Mesh(tp=mesh.tp, ep=mesh.ep, dp=mesh.dp, rank=rank % mesh.world, dp_rank=rank // mesh.world, group=object())
    return Mesh(tp=mesh.tp, ep=mesh.ep, rank=rank, group=object())


def _positions(name: str, shape: torch.Size, spec: ModelSpec, contract, mesh: Mesh, rank: int) -> Tensor:
    """The flat positions in the whole weight of shard rank `rank`'s shard, in the shard's element order."""
    index = torch.arange(shape.numel()).view(shape)
    return shard_of(name, index, spec, contract, _rank_mesh(mesh, rank)).reshape(-1)


_CUTS: dict[tuple, slice | Tensor] = {}  # `_cut_key` -> the cut: found once a process


def _cut_key(name: str, shape: torch.Size, spec: ModelSpec, contract, mesh: Mesh, rank: int) -> tuple:
    """Everything `plan.shard_of` reads to cut `name`: a layer's weight by its mixer's or feed-forward's spec (the
    same in every layer of a kind), others by name and the vocabulary; the contract's leaves and vocabulary blocks."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        layer, owner = spec.layers[int(parts[2])], parts[3]
        part = layer.mixer if owner in ("self_attn", "linear_attn") else layer.ffn if owner == "mlp" else None
        where = (owner, part, ".".join(parts[4:]))
    else:
        where = (name, spec.vocab_size)
    return where, tuple(shape), num_leaves(contract), vocab_block(contract), mesh.tp, mesh.ep, mesh.shard_ranks, rank


def _cut(name: str, shape: torch.Size, spec: ModelSpec, contract, mesh: Mesh, rank: int) -> slice | Tensor:
    """Where shard rank `rank`'s shard of `name` sits in the whole weight, flat: a slice where it is one run in order, else
    its positions (`_positions`)."""
    key = _cut_key(name, shape, spec, contract, mesh, rank)
    cut = _CUTS.get(key)
    if cut is None:
        positions = _positions(name, shape, spec, contract, mesh, rank)
        start = int(positions[0]) if positions.numel() else 0
        in_order = positions.numel() < 2 or bool((positions[1:] - positions[:-1] == 1).all())
        cut = _CUTS[key] = slice(start, start + positions.numel()) if in_order else positions
    return cut


def unshard_state(local: dict[str, Tensor], spec: ModelSpec, contract, mesh: Mesh, *, first_only: bool = False) -> dict[str, Tensor]:
    """The whole model's state dict from each rank's `local` one (`model.state_dict()`), or of the weights `local`
    names, when every rank names the same ones: on every rank, or with `first_only` on the group's first rank alone
    (the others send theirs and return {}). Host tensors, or the GPU's where the ranks gather over NCCL."""
    local = {name: _whole(t).detach() for name, t in sorted(local.items())}
    if mesh.shard_ranks == 1:
        return {name: t.cpu() for name, t in local.items()}
    return _gathered(local, spec, contract, mesh, first_only)


ALIGN = 16  # bytes: every shard's run in a gathered buffer starts here, so it can be viewed as any dtype


def _count(cut: slice | Tensor) -> int:
    return cut.stop - cut.start if isinstance(cut, slice) else cut.numel()


def _run_bytes(cut: slice | Tensor, dtype: torch.dtype) -> int:
    return -(-_count(cut) * dtype.itemsize // ALIGN) * ALIGN


def _gathered(local: dict[str, Tensor], spec: ModelSpec, contract, mesh: Mesh, first_only: bool) -> dict[str, Tensor]:
    """Each rank's shards as one byte buffer, gathered by a tensor collective (NCCL: GPU to GPU; gloo: through host
    memory) and put back where they were cut from, in the shards' dtypes (a bfloat16 model's float32 masters and
    moments stay float32). Every rank knows every rank's shard sizes from the cuts, so nothing but the bytes crosses."""
    group, ranks, me = mesh.shard_group, mesh.shard_ranks, mesh.shard_rank
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    shapes, names = _shapes(spec), list(local)
    cuts = [{name: _cut(name, shapes[name][0], spec, contract, mesh, rank) for name in names} for rank in range(ranks)]
    width = max(sum(_run_bytes(cut[name], local[name].dtype) for name in names) for cut in cuts)
    mine, offset = torch.zeros(width, dtype=torch.uint8, device=device), 0
    for name in names:
        run = local[name].reshape(-1).view(torch.uint8)
        if run.numel() != _count(cuts[me][name]) * local[name].dtype.itemsize:
            raise ValueError(f"rank {me}'s {name} has {local[name].numel()} elements; its cut has {_count(cuts[me][name])}")
        mine[offset : offset + run.numel()] = run.to(device)
        offset += _run_bytes(cuts[me][name], local[name].dtype)
    receives = me == 0 or not first_only
    gathered = [torch.empty_like(mine) for _ in range(ranks)] if receives else None
    if first_only:
        dist.gather(mine, gathered, group=group, group_dst=0)
    else:
        dist.all_gather(gathered, mine, group=group)
    if not receives:
        return {}
    whole, offsets = {}, [0] * ranks
    for name in names:
        shape, kind = shapes[name][0], local[name].dtype
        out = torch.empty(shape.numel(), dtype=kind, device=device)
        for rank, buffer in enumerate(gathered):
            cut = cuts[rank][name]
            out[cut] = buffer[offsets[rank] : offsets[rank] + _count(cut) * kind.itemsize].view(kind)
            offsets[rank] += _run_bytes(cut, kind)
        whole[name] = out.view(shape)
    return whole


def dp_rows(rows: int, mesh: Mesh) -> slice:
    """The rows of a tensor FSDP2 gives this data-parallel group (torch.chunk on dim 0; trailing groups may get none)."""
    per_group = -(-rows // mesh.dp) if rows else 0
    start = min(rows, mesh.dp_rank * per_group)
    return slice(start, min(rows, start + per_group))


class GradNorm:
    """torch's clip_grad_norm_ for a side's sharded model: the L2 norm of the whole model's gradient (each element
    once, summed over the side's ranks by the collective: gradients need only be correct), and every rank's
    gradients scaled alike."""

    def __init__(self, spec: ModelSpec, contract, mesh: Mesh):
        self.mesh = mesh
        # name -> 1 / (ranks holding it) for each element of this rank's shard; one float where all are alike (most
        # weights: held by one rank, or by all), found once per distinct cut and shared by the layers that have it.
        # The holders are the model group's ranks (FSDP cuts a group's shards over the groups, which the all-reduce
        # sums), or the side's for experts cut over it (`spread_over_side`, one rank each, not FSDP's).
        self.shares, found = {}, {}
        for name, (shape, _) in _shapes(spec).items():
            spread = spread_over_side(name, mesh)
            rank = mesh.shard_rank if spread else mesh.rank
            key = _cut_key(name, shape, spec, contract, mesh, rank)
            if key not in found:
                holders = torch.zeros(shape.numel())
                for other in range(mesh.shard_ranks if spread else mesh.world):
                    holders[_cut(name, shape, spec, contract, mesh, other)] += 1
                share = 1.0 / holders[_cut(name, shape, spec, contract, mesh, rank)]
                found[key] = float(share[0]) if share.numel() and bool((share == share[0]).all()) else share
            self.shares[name] = found[key]
        self._on_device = {}  # id of a shares tensor -> its copy where the gradients are (moved once, not every step)

    def clip(self, named_parameters, max_norm: float) -> Tensor:
        total, grads = None, []  # summed where the gradients are (0 + x is x: the same bits as starting from zero)
        for name, p in named_parameters:
            if p.grad is None:
                continue
            grads.append(p.grad)
            g = (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).double()
            share = self.shares[name]
            if isinstance(share, float):
                part = (g * g).sum() * share
            else:
                if id(share) not in self._on_device:
                    self._on_device[id(share)] = share.to(g.device)
                share = self._on_device[id(share)].view(p.shape)  # the rank's shard, before FSDP cut it over the groups
                if self.mesh.dp > 1:
                    share = share[dp_rows(p.shape[0], self.mesh)]
                part = (g * g * share).sum()
            total = part if total is None else total + part
        total = torch.zeros((), dtype=torch.float64) if total is None else total
        if self.mesh.world * self.mesh.dp > 1:
            # NCCL carries GPU tensors alone; gloo, host ones (ranks may share a GPU)
            total = total.cuda() if dist.get_backend() == "nccl" else total.cpu()
            dist.all_reduce(total)  # every rank of the side: the shards' sums
        norm = total.sqrt().float()
        scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.device, g.dtype))
        return norm
