"""The ops a rank binds: the contract's own, composed with the collectives its shard needs.

- Column-parallel projections run the bound op on the rank's weight rows; no collective in the forward.
  Their input is replicated, so in the backward each rank holds part of its gradient: those are summed
  (all-reduce) — gradients need only be correct.
- Row-parallel projections run the impl's two halves (`Impl.leaf_parts`): the rank's leaf partials, an
  all-gather of every rank's partials (bytes, in rank order = leaf order), and the fold by the contract's
  leaf tree on every rank. TP = 1 folds the same partials by the same tree, so every TP that divides the
  leaf count gives the same bits, and every rank the same output. No collective does arithmetic there.
- An impl without leaf parts (`native`'s cuBLAS / oneDNN GEMM) is composed as the frameworks do it: the
  rank's GEMM over its K columns, rounded, then an all-reduce sum — the control that must differ.
- Routed experts (expert parallelism): each rank runs the bound experts op on the (token, slot) pairs routed
  to its experts, the ranks' [T, k, H] outputs are all-gathered (bytes) and each pair takes its expert's
  rank's row. The router and the combine run whole on every rank (replicated inputs), so the combine sums
  the same rows in the same order as one process.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..model import MLPSpec
from ..ops.common import torch_dtype
from ..ops.linear.reference import linear_grads, rank_leaves
from ..runtime.registry import REGISTRY
from .mesh import Mesh
from .plan import COLUMN_PARALLEL, ROW_PARALLEL, num_leaves


class _ReplicatedInput(torch.autograd.Function):
    """Identity forward; the backward sums the ranks' gradients of a replicated input."""

    @staticmethod
    def forward(ctx, x, mesh):
        ctx.mesh = mesh
        return x

    @staticmethod
    def backward(ctx, grad):
        return ctx.mesh.all_reduce_sum(grad.contiguous().clone()), None


def _column_parallel(bound: Callable, mesh: Mesh) -> Callable:
    def op(x, weight, bias=None):
        if torch.is_grad_enabled() and x.requires_grad:
            x = _ReplicatedInput.apply(x, mesh)
        return bound(x, weight, bias)

    return op


class _RowParallel(torch.autograd.Function):
    """y = fold(all-gathered leaf partials of every rank) (+ bias); backward local to the rank (y is replicated)."""

    @staticmethod
    def forward(ctx, x, weight, bias, parts, constants, mesh, leaves, global_k):
        partials_fn, fold_fn = parts
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        local = partials_fn(x, weight, leaves=leaves, global_k=global_k, **constants)  # [M, N, leaves of this rank]
        partials = torch.cat(mesh.all_gather(local), dim=-1)  # [M, N, G], in leaf order
        return fold_fn(partials, bias, **constants).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        return (*linear_grads(ctx, grad), None, None, None, None, None)


def _row_parallel(bound: Callable, impl, constants: dict, mesh: Mesh, leaves: int, global_k: int) -> Callable:
    if impl.leaf_parts is None:  # the frameworks' composition: local GEMM, rounded, summed by the collective
        def native(x, weight, bias=None):
            y = bound(x, weight, None if mesh.rank else bias)
            return mesh.all_reduce_sum(y.float()).to(y.dtype)

        return native
    mine = rank_leaves(leaves, mesh.rank, mesh.tp)  # `leaves` is the contract's here: the impl has leaf parts

    def op(x, weight, bias=None):
        return _RowParallel.apply(x, weight, bias, impl.leaf_parts, constants, mesh, mine, global_k)

    return op


class _OwnedRows(torch.autograd.Function):
    """Each (token, slot)'s row from its expert's rank: the gathered rows forward, the gradient of the rows
    this rank computed back to its own computation (the others' go to theirs)."""

    @staticmethod
    def forward(ctx, mine, gathered, owned):
        ctx.save_for_backward(owned)
        return torch.where(owned[..., None], mine, gathered)

    @staticmethod
    def backward(ctx, grad):
        (owned,) = ctx.saved_tensors
        return torch.where(owned[..., None], grad, 0.0), None, None


def _expert_parallel(bound: Callable, output_dtype, mesh: Mesh) -> Callable:
    def experts(x, ids, gate_up, down):
        num_local = gate_up.shape[0]
        first = mesh.rank * num_local
        tokens, top_k = ids.shape
        owned = (ids >= first) & (ids < first + num_local)  # [T, k]
        mine = x.new_zeros((tokens, top_k, x.shape[-1]), dtype=output_dtype)
        t, j = torch.nonzero(owned, as_tuple=True)
        if t.numel():
            xe = _ReplicatedInput.apply(x, mesh) if torch.is_grad_enabled() and x.requires_grad else x
            rows = bound(xe[t], (ids[t, j] - first)[:, None], gate_up, down)[:, 0]  # [n, H], one slot a row
            mine = mine.index_put((t, j), rows)
        owner = torch.div(ids, num_local, rounding_mode="floor")  # [T, k]
        gathered = torch.stack(mesh.all_gather(mine.detach()))  # [ranks, T, k, H]
        picked = gathered.gather(0, owner[None, ..., None].expand(1, -1, -1, x.shape[-1]))[0]
        return _OwnedRows.apply(mine, picked, owned)

    return experts


def _entry_of(contract, op: str, case: str):
    return next(entry for region, c, entry in contract.cells() if c == case and op in entry.ops)


def compose(ops: dict[str, Callable], contract, case: str, spec, mesh: Mesh) -> dict[str, Callable]:
    """`ops` (one case's bound ops, for the whole model's `spec`) as a rank of `mesh` runs them."""
    composed = dict(ops)
    if mesh.ep > 1 and "experts" in ops:
        output_dtype = torch_dtype(_entry_of(contract, "experts", case).constants["output_dtype"])
        composed["experts"] = _expert_parallel(ops["experts"], output_dtype, mesh)
    if mesh.tp == 1:
        return composed
    leaves = num_leaves(contract) or mesh.tp
    global_k = {"o_proj": {layer.mixer.num_heads * layer.mixer.head_dim for layer in spec.layers},
                "down_proj": {layer.ffn.intermediate_size for layer in spec.layers if isinstance(layer.ffn, MLPSpec)}}
    for name in COLUMN_PARALLEL:
        if name in ops:
            composed[name] = _column_parallel(ops[name], mesh)
    for name in ROW_PARALLEL:
        if name not in ops or not global_k[name]:
            continue
        if len(global_k[name]) != 1:
            raise ValueError(f"tensor parallelism needs every layer's {name} of one width, got {sorted(global_k[name])}")
        entry = _entry_of(contract, name, case)
        impl = REGISTRY.get(entry.impl.id, entry.impl.version)
        composed[name] = _row_parallel(ops[name], impl, dict(entry.constants), mesh, leaves, next(iter(global_k[name])))
    return composed

