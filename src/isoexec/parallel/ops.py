"""The ops a rank binds: the contract's own, composed with the collectives its shard needs.

- Column-parallel projections run the bound op on the rank's weight rows; no collective in the forward.
  Their input is replicated, so in the backward each rank holds part of its gradient: those are summed
  (all-reduce) — gradients need only be correct. The same holds for weights every rank holds whole but uses
  for its heads only (q_norm, k_norm), and for key/value heads replicated where TP exceeds them (summed over
  the ranks holding the same heads).
- Row-parallel projections run the impl's two halves (`Impl.leaf_parts`): the rank's leaf partials, an
  all-gather of every rank's partials (bytes, in rank order = leaf order), and the fold by the contract's
  leaf tree on every rank. TP = 1 folds the same partials by the same tree, so every TP that divides the
  leaf count gives the same bits, and every rank the same output. No collective does arithmetic there.
- An impl without leaf parts (`native`'s cuBLAS / oneDNN GEMM) is composed as the frameworks do it: the
  rank's GEMM over its K columns, rounded, then an all-reduce sum — the control that must differ.
- Routed experts (expert parallelism): each rank runs the bound experts op on the (token, slot) pairs routed
  to its experts (whole experts, uneven where EP does not divide them), and the ranks' rows are all-gathered
  (bytes) and put back in (token, slot) order. The router and the combine run whole on every rank (replicated
  inputs), so the combine sums the same rows in the same order as one process. Where EP spans the side (EP =
  TP x DP, each group scoring its own sequences), each of a group's ranks takes a contiguous share of the group's
  tokens, sends its pairs to their experts' ranks in every group and takes the results back (all-to-all over the
  side), and the group's ranks all-gather their shares (bytes): every pair still meets its own expert's op alone.
- The vocabulary: each rank holds whole vocab blocks of the embedding and of lm_head (`plan.vocab_shards`).
  The embedding looks up the ids in the rank's rows; the ranks' rows are all-gathered (bytes) and each token
  takes its owner's. lm_head is column-parallel: the rank's logits columns. The log-probs run the impl's
  `vocab_parallel` form: the rank's per-block maxima and exp-sums, all-gathered and folded by the contract's
  tree on every rank, so each rank's columns are the whole row's bit for bit; the columns are then gathered
  (bytes) into whole rows, which sampling and the trainer read as in one process. An impl without that form
  (`native`'s log_softmax) is composed as the frameworks do it: max and sum-of-exp all-reduced.
- Sequence parallelism: between a row-parallel projection and the next column-parallel one each rank holds
  a contiguous shard of the tokens (the call's T padded to a multiple of TP). An MoE layer runs on the shard:
  the router and the combine per token, the experts' pairs dispatched to their ranks and back by all-to-all
  (EP = TP, or EP over the whole side), or run by the rank itself (EP = 1). The row-parallel fold is
  evaluated for the rank's tokens only (the same gathered partials, the same tree: the reduce-scatter that
  equals all-reduce-then-slice), the residual adds and norms run on the shard, the column-parallel input is
  all-gathered (bytes), and the final norm's output too, so the rows the trainer and the engine read are
  whole. Every row meets the same operations as in one process. In the backward, the norms' weights saw only
  the rank's tokens: their gradients are summed over the ranks.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ..model import AttentionSpec, GDNSpec, MLPSpec, MoESpec, current_step
from ..ops.common import TILE_ELEMENTS, torch_dtype
from ..ops.linear.reference import linear_grads, rank_leaves
from ..runtime.binding import SIBLINGS, joined_name
from ..runtime.registry import REGISTRY
from .mesh import Mesh
from .plan import COLUMN_PARALLEL, ROW_PARALLEL, expert_starts, num_leaves, vocab_shards


class _SumGradient(torch.autograd.Function):
    """Identity forward; the backward sums the ranks' gradients. For a tensor every rank holds whole but whose
    gradient each rank computes only a part of: a replicated input of a rank's columns or experts, a weight used
    on the rank's own tokens or heads."""

    @staticmethod
    def forward(ctx, t, mesh):
        ctx.mesh = mesh
        return t

    @staticmethod
    def backward(ctx, grad):
        return ctx.mesh.all_reduce_sum(grad.contiguous().clone()), None


def _replicated(t: Tensor, mesh: Mesh) -> Tensor:
    """`t`, its gradient summed over the ranks (where a gradient is being recorded)."""
    return _SumGradient.apply(t, mesh) if torch.is_grad_enabled() and t.requires_grad else t


class _SharedGradient(torch.autograd.Function):
    """Identity forward; the backward sums, in rank order, the gradients of the ranks holding the same copy of a
    weight (`peers`: key/value heads replicated where TP exceeds them, each copy read by its rank's queries)."""

    @staticmethod
    def forward(ctx, weight, mesh, peers):
        ctx.mesh, ctx.peers = mesh, peers
        return weight

    @staticmethod
    def backward(ctx, grad):
        gathered = ctx.mesh.all_gather(grad.contiguous())
        total = gathered[ctx.peers[0]].clone()
        for rank in ctx.peers[1:]:
            total += gathered[rank]
        return total, None, None


def _kv_projection(bound: Callable, mesh: Mesh, peers: list[int]) -> Callable:
    """k_proj / v_proj where TP exceeds the key/value heads: the rank's copy of its heads' rows, whose gradient is
    summed over the ranks holding the same heads."""
    column = _column_parallel(bound, mesh)

    def op(x, weight, bias=None):
        if torch.is_grad_enabled():
            weight, bias = (t if t is None or not t.requires_grad else _SharedGradient.apply(t, mesh, peers) for t in (weight, bias))
        return column(x, weight, bias)

    return op


def _tokens() -> int:
    """The call's token count, from the step being run (the ops see only their shards)."""
    return current_step().batch.positions.shape[0]


def _shard_rows(x: Tensor, mesh: Mesh) -> Tensor:
    """The rank's contiguous shard of x's rows, x padded to a multiple of TP rows (zeros)."""
    per_rank = -(-x.shape[0] // mesh.tp)
    padded = torch.cat([x, x.new_zeros((per_rank * mesh.tp - x.shape[0], *x.shape[1:]))]) if x.shape[0] % mesh.tp else x
    return padded[mesh.rank * per_rank : (mesh.rank + 1) * per_rank]


class _GatherRows(torch.autograd.Function):
    """Every rank's shard of rows, whole (`tokens` of them). The backward takes the rank's rows of the gradient,
    summed over the ranks first where each rank's gradient is a part (`partial`: a column-parallel input)."""

    @staticmethod
    def forward(ctx, x, mesh, tokens, partial):
        ctx.mesh, ctx.partial = mesh, partial
        return torch.cat(mesh.all_gather(x))[:tokens]

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        if ctx.partial:
            grad = ctx.mesh.all_reduce_sum(grad)
        return _shard_rows(grad, ctx.mesh), None, None, None


def _column_parallel(bound: Callable, mesh: Mesh) -> Callable:
    def op(x, weight, bias=None):
        if mesh.sp:
            x = _GatherRows.apply(x, mesh, _tokens(), True)
        else:
            x = _replicated(x, mesh)
        return bound(x, weight, bias)

    return op


class _RowParallel(torch.autograd.Function):
    """y = fold(all-gathered leaf partials of every rank) (+ bias), for every token or (sequence parallel) the
    rank's shard of them; the backward is local to the rank, given the whole output's gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, parts, constants, mesh, leaves, global_k):
        partials_fn, fold_fn = parts
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.mesh, ctx.tokens = bias is not None, mesh, x.shape[0]
        local = partials_fn(x, weight, leaves=leaves, global_k=global_k, **constants)  # [M, N, leaves of this rank]
        partials = torch.cat(mesh.all_gather(local), dim=-1)  # [M, N, G], in leaf order
        if mesh.sp:
            partials = _shard_rows(partials, mesh)
        return fold_fn(partials, bias, **constants).reshape(partials.shape[0], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        if ctx.mesh.sp:  # every rank's x fed every shard: the whole output's gradient
            grad = torch.cat(ctx.mesh.all_gather(grad.contiguous()))[: ctx.tokens]
        return (*linear_grads(ctx, grad), None, None, None, None, None)


class _SumOverRanks(torch.autograd.Function):
    """The ranks' tensors summed by the collective (native's composition); each rank's part gets the sum's gradient."""

    @staticmethod
    def forward(ctx, x, mesh):
        return mesh.all_reduce_sum(x.clone())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _row_parallel(bound: Callable, impl, constants: dict, mesh: Mesh, leaves: int, global_k: int) -> Callable:
    if impl.leaf_parts is None:  # the frameworks' composition: local GEMM, rounded, summed by the collective
        def native(x, weight, bias=None):
            y = bound(x, weight, None if mesh.rank else bias)
            y = _SumOverRanks.apply(y.float(), mesh).to(y.dtype)
            return _shard_rows(y, mesh) if mesh.sp else y

        return native
    mine = rank_leaves(leaves, mesh.rank, mesh.tp)  # `leaves` is the contract's here: the impl has leaf parts

    def op(x, weight, bias=None):
        return _RowParallel.apply(x.reshape(-1, x.shape[-1]), weight, bias, impl.leaf_parts, constants, mesh, mine, global_k)

    return op


class _ShardRows(torch.autograd.Function):
    """The rank's shard of rows every rank holds whole; the backward puts the shards' gradients together."""

    @staticmethod
    def forward(ctx, x, mesh):
        ctx.mesh, ctx.tokens = mesh, x.shape[0]
        return _shard_rows(x, mesh)

    @staticmethod
    def backward(ctx, grad):
        return torch.cat(ctx.mesh.all_gather(grad.contiguous()))[: ctx.tokens], None


def _sequence_parallel(ops: dict[str, Callable], mesh: Mesh) -> dict[str, Callable]:
    """The embedding's output, the residual norms, an MoE layer (router, experts, combine) and the final norm on the
    rank's shard of the tokens (the final norm's output gathered whole). The routing record, which the MoE layers
    write row by row, is the shard's during the forward and gathered whole with the final norm's output."""
    composed = dict(ops)
    embed, final = ops["embed_tokens"], ops["norm"]
    whole_routing = []  # the step's own routing buffer, while its layers write the shard's

    def embed_shard(ids, weight):
        out = _ShardRows.apply(embed(ids, weight), mesh)
        current = current_step()
        if current.routing is not None:
            whole_routing.append(current.routing)
            current.routing = current.routing.new_full((out.shape[0], *current.routing.shape[1:]), -1)
        return out

    def norm(h, residual, weight, *rest):
        normed, stream = final(h, residual, _replicated(weight, mesh), *rest)
        if whole_routing:
            current, whole = current_step(), whole_routing.pop()
            whole.copy_(torch.cat(mesh.all_gather(current.routing))[: whole.shape[0]])
            current.routing = whole
        return _GatherRows.apply(normed, mesh, _tokens(), False), stream

    composed["embed_tokens"], composed["norm"] = embed_shard, norm
    for name in ("input_layernorm", "post_attention_layernorm"):
        composed[name] = (lambda norm: lambda h, residual, weight, *rest: norm(h, residual, _replicated(weight, mesh), *rest))(ops[name])
    for name in ("router", "shared_expert_gate"):  # their weights saw the rank's tokens only: gradients summed over the ranks
        if name in ops:
            composed[name] = (lambda op: lambda x, weight, *rest: op(x, _replicated(weight, mesh), *rest))(ops[name])
    if "experts" in ops and mesh.ep == 1:  # every rank holds every expert and runs its own tokens' pairs
        experts = ops["experts"]
        composed["experts"] = lambda x, ids, gate_up, down: experts(x, ids, _replicated(gate_up, mesh), _replicated(down, mesh))
    return composed


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


class _GatheredRows(torch.autograd.Function):
    """Every rank's rows ([counts[rank], H] each) stacked in rank order: bytes moved. The backward gives this rank
    the gradient of its own rows (every rank holds the same gradient of the whole)."""

    @staticmethod
    def forward(ctx, rows, mesh, counts):
        ctx.offset, ctx.count = sum(counts[: mesh.rank]), counts[mesh.rank]
        padded = rows.new_zeros((max(counts), *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        return torch.cat([part[:count] for part, count in zip(mesh.all_gather(padded), counts)])

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.offset : ctx.offset + ctx.count], None, None


def _expert_parallel(bound: Callable, output_dtype, mesh: Mesh, num_experts: int) -> Callable:
    """Each rank runs the bound experts op on the (token, slot) pairs routed to its experts; the ranks' rows are
    all-gathered (only those: counts known to every rank, since the ids are) and put back in (token, slot) order.
    The tokens are replicated over the ranks, so no rows need sending to an expert's rank: the dispatch is each
    rank's own pick, and only the results travel."""
    starts = expert_starts(num_experts, mesh.ep)

    def experts(x, ids, gate_up, down):
        tokens, top_k = ids.shape
        owner = torch.bucketize(ids.flatten(), torch.tensor(starts[1:-1], device=ids.device), right=True)  # [T k]
        order = torch.argsort(owner, stable=True)  # the pairs by owning rank, in (token, slot) order within one
        counts = torch.bincount(owner, minlength=mesh.ep).tolist()
        offset = sum(counts[: mesh.rank])
        pairs = order[offset : offset + counts[mesh.rank]]
        t, j = pairs // top_k, pairs % top_k
        xe = _replicated(x, mesh)  # every rank joins the gradient's sum, owning pairs or not
        if t.numel():
            rows = bound(xe[t], (ids[t, j] - starts[mesh.rank])[:, None], gate_up, down)[:, 0]  # [n, H], one slot a row
        else:
            rows = xe[t].to(output_dtype)  # [0, H], still on x's graph
        gathered = _GatheredRows.apply(rows, mesh, counts)  # [T k, H] in `order`
        return gathered[torch.argsort(order)].reshape(tokens, top_k, x.shape[-1])

    return experts


class _AllToAll(torch.autograd.Function):
    """Rows sent to their ranks and received from them (`Mesh.all_to_all`); the backward sends the gradients of the
    received rows back to their senders, the same way reversed."""

    @staticmethod
    def forward(ctx, rows, mesh, sent, received):
        ctx.mesh, ctx.sent, ctx.received = mesh, sent, received
        return mesh.all_to_all(rows, sent, received)

    @staticmethod
    def backward(ctx, grad):
        return ctx.mesh.all_to_all(grad.contiguous(), ctx.received, ctx.sent), None, None, None


def _expert_parallel_tokens(bound: Callable, output_dtype, mesh: Mesh, num_experts: int) -> Callable:
    """Expert parallelism where each rank holds its own tokens (sequence parallelism): the rank's (token, slot)
    pairs are dispatched to their experts' ranks by an all-to-all (the rows, and their expert ids), each rank runs
    the bound experts op on the pairs it received, and a second all-to-all returns the results to their tokens'
    ranks, which put them back in (token, slot) order for the combine."""
    starts = expert_starts(num_experts, mesh.ep)

    def experts(x, ids, gate_up, down):
        tokens, top_k = ids.shape
        flat = ids.flatten()
        owner = torch.bucketize(flat, torch.tensor(starts[1:-1], device=ids.device), right=True)  # [S k]
        order = torch.argsort(owner, stable=True)  # this rank's pairs by owning rank, (token, slot) order within
        counts = torch.stack(mesh.all_gather(torch.bincount(owner, minlength=mesh.ep)))  # [sender, owner]
        sent, received = counts[mesh.rank].tolist(), counts[:, mesh.rank].tolist()
        rows = _AllToAll.apply(x[order // top_k], mesh, sent, received)  # [n, H], the pairs this rank's experts take
        expert = mesh.all_to_all(flat[order], sent, received) - starts[mesh.rank]
        if rows.shape[0]:
            out = bound(rows, expert[:, None], gate_up, down)[:, 0]
        else:
            out = rows.to(output_dtype)  # [0, H], still on the graph: the backward's all-to-all runs on every rank
        back = _AllToAll.apply(out, mesh, received, sent)  # [S k, H] in `order`
        return back[torch.argsort(order)].reshape(tokens, top_k, x.shape[-1])

    return experts


def _expert_parallel_side(bound: Callable, output_dtype, mesh: Mesh, num_experts: int) -> Callable:
    """Expert parallelism over every rank of the side (EP = TP x DP). Under SP a rank's tokens are its own and its
    pairs go straight to the all-to-all over the side; otherwise the group's tokens are replicated over its TP
    ranks, so each takes a contiguous share of them (rank r: [floor(rT/TP), floor((r+1)T/TP))) to dispatch, and
    the group all-gathers the shares' results in rank order, which is token order."""
    over_side = _expert_parallel_tokens(bound, output_dtype, mesh.ep_mesh(), num_experts)
    if mesh.sp:
        return over_side

    def experts(x, ids, gate_up, down):
        tokens, top_k = ids.shape
        bounds = [r * tokens // mesh.tp for r in range(mesh.tp + 1)]
        mine = slice(bounds[mesh.rank], bounds[mesh.rank + 1])
        xe = _replicated(x, mesh)  # each rank's gradient covers its share of the tokens: summed over the group
        rows = over_side(xe[mine], ids[mine], gate_up, down).reshape(-1, x.shape[-1])  # [share k, H]
        counts = [(bounds[r + 1] - bounds[r]) * top_k for r in range(mesh.tp)]
        return _GatheredRows.apply(rows, mesh, counts).reshape(tokens, top_k, x.shape[-1])

    return experts


def _gather_columns(t: Tensor, mesh: Mesh, widths: list[int]) -> Tensor:
    """Every rank's columns of `t` ([R, widths[rank]]), side by side in rank order: [R, sum(widths)]; bytes moved."""
    padded = torch.nn.functional.pad(t, (0, max(widths) - t.shape[-1]))
    return torch.cat([part[..., :width] for part, width in zip(mesh.all_gather(padded), widths)], dim=-1)


def _vocab_parallel_embedding(bound: Callable, mesh: Mesh, shards: list[slice]) -> Callable:
    mine = shards[mesh.rank]
    starts = torch.tensor([shard.start for shard in shards[1:]])

    def embed(ids, weight):
        owned = (ids >= mine.start) & (ids < mine.stop)
        if weight.shape[0]:
            rows = bound(torch.where(owned, ids - mine.start, 0), weight)  # [..., H], a row of this rank's table for every id
            rows = torch.where(owned[..., None], rows, 0)
        else:  # a rank without vocabulary blocks
            rows = weight.new_zeros((*ids.shape, weight.shape[-1]))
        owner = torch.bucketize(ids, starts.to(ids.device), right=True)  # [...]
        gathered = torch.stack(mesh.all_gather(rows.detach()))  # [ranks, ..., H]
        picked = gathered.gather(0, owner[None, ..., None].expand(1, *rows.shape))[0]
        return _OwnedRows.apply(rows, picked, owned)

    return embed


def _lm_head(bound: Callable, mesh: Mesh) -> Callable:
    """The rank's logits columns; its input (the final norm's output, whole on every rank) is replicated."""
    def op(x, weight):
        return bound(_replicated(x, mesh), weight)

    return op


class _VocabParallelLogprobs(torch.autograd.Function):
    """Whole log-prob rows from the rank's logits columns: `part` gives the rank's columns of them (row tiles
    counted from the whole vocabulary, so every rank runs the same collectives), gathered as bytes. The
    backward is the log-softmax's, the gradient of whole rows being the same on every rank."""

    @staticmethod
    def forward(ctx, logits, part, mesh, widths):
        rows = logits.flatten(0, -2) if logits.dim() > 1 else logits[None]  # [R, v] (v may be 0: a rank without blocks)
        tile = max(1, TILE_ELEMENTS // sum(widths))
        out = torch.cat([part(rows[r0 : r0 + tile]) for r0 in range(0, max(1, rows.shape[0]), tile)])[: rows.shape[0]]
        start = sum(widths[: mesh.rank])
        ctx.save_for_backward(out)
        ctx.columns, ctx.input_shape, ctx.input_dtype = slice(start, start + widths[mesh.rank]), logits.shape, logits.dtype
        return _gather_columns(out, mesh, widths).reshape(*logits.shape[:-1], sum(widths))

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        dtype = torch.promote_types(out.dtype, torch.float32)
        g = grad.reshape(-1, grad.shape[-1]).to(dtype)
        dx = g[:, ctx.columns] - torch.exp(out.to(dtype)) * g.sum(-1, keepdim=True)
        return dx.to(ctx.input_dtype).reshape(ctx.input_shape), None, None, None


def _vocab_parallel_logprobs(impl, constants: dict, mesh: Mesh, shards: list[slice]) -> Callable:
    widths = [shard.stop - shard.start for shard in shards]
    if impl.vocab_parallel is not None:
        block = constants["vocab_block"]
        counts = [-(-width // block) for width in widths]  # every rank's vocab blocks

        def part(x):
            return impl.vocab_parallel(x, lambda leaves: _gather_columns(leaves, mesh, counts), **constants)
    else:  # the frameworks' composition: max and sum-of-exp all-reduced (the sum by the collective's order)
        output_dtype = torch_dtype(constants["output_dtype"])

        def part(x):
            x = x.float()
            row_max = mesh.all_reduce_max(x.max(-1, keepdim=True).values)
            shifted = x - row_max
            return (shifted - torch.log(mesh.all_reduce_sum(torch.exp(shifted).sum(-1, keepdim=True)))).to(output_dtype)

    return lambda logits: _VocabParallelLogprobs.apply(logits, part, mesh, widths)


def _vocabulary(ops: dict[str, Callable], contract, case: str, spec, mesh: Mesh) -> dict[str, Callable]:
    """The embedding, lm_head and the log-probs over the rank's vocabulary blocks."""
    composed, shards = dict(ops), vocab_shards(spec.vocab_size, contract, mesh.tp)
    composed["embed_tokens"] = _vocab_parallel_embedding(ops["embed_tokens"], mesh, shards)
    composed["lm_head"] = _lm_head(ops["lm_head"], mesh)
    entry = _entry_of(contract, "logprobs", case)
    composed["logprobs"] = _vocab_parallel_logprobs(REGISTRY.get(entry.impl.id, entry.impl.version), dict(entry.constants), mesh, shards)
    return composed


JOINED = frozenset(joined_name(names) for names in SIBLINGS)


def _entry_of(contract, op: str, case: str):
    return next(entry for region, c, entry in contract.cells() if c == case and op in entry.ops)


def compose(ops: dict[str, Callable], contract, case: str, spec, mesh: Mesh) -> dict[str, Callable]:
    """`ops` (one case's bound ops, for the whole model's `spec`) as a rank of `mesh` runs them."""
    composed = dict(ops)
    if mesh.ep > 1 and "experts" in ops:
        output_dtype = torch_dtype(_entry_of(contract, "experts", case).constants["output_dtype"])
        counts = {layer.ffn.num_experts for layer in spec.layers if isinstance(layer.ffn, MoESpec)}
        if len(counts) != 1:
            raise ValueError(f"EP = {mesh.ep} cuts every MoE layer's experts alike: it needs one expert count, got {sorted(counts)}")
        dispatch = _expert_parallel_side if mesh.ep_spans_groups else _expert_parallel_tokens if mesh.sp else _expert_parallel
        composed["experts"] = dispatch(ops["experts"], output_dtype, mesh, counts.pop())
    if mesh.tp == 1:
        return composed
    # A rank's q/k/v and gate/up are column-parallel ops of their own (gathers under SP, shared key/value
    # heads): the model calls them one by one.
    composed = {name: op for name, op in composed.items() if name not in JOINED}
    composed = _vocabulary(composed, contract, case, spec, mesh)
    if mesh.sp:
        composed = _sequence_parallel(composed, mesh)
    leaves = num_leaves(contract) or mesh.tp
    attention = [layer.mixer for layer in spec.layers if isinstance(layer.mixer, AttentionSpec)]
    global_k = {"o_proj": {mixer.num_heads * mixer.head_dim for mixer in attention},
                "out_proj": {layer.mixer.value_dim for layer in spec.layers if isinstance(layer.mixer, GDNSpec)},
                "down_proj": {layer.ffn.intermediate_size if isinstance(layer.ffn, MLPSpec) else layer.ffn.shared_intermediate_size
                              for layer in spec.layers if isinstance(layer.ffn, MLPSpec) or getattr(layer.ffn, "shared_intermediate_size", 0)}}
    for name in COLUMN_PARALLEL:
        if name in ops:
            composed[name] = _column_parallel(ops[name], mesh)
    for name in ("q_norm", "k_norm"):  # one weight for every head: each rank's gradient covers its heads
        if name in ops:
            composed[name] = (lambda norm: lambda x, weight, *rest: norm(x, _replicated(weight, mesh), *rest))(ops[name])
    if "gated_norm" in ops:  # GDN's output norm: likewise, one weight for every value head
        composed["gated_norm"] = (lambda norm: lambda x, z, weight, *rest: norm(x, z, _replicated(weight, mesh), *rest))(ops["gated_norm"])
    kv_heads = {mixer.num_kv_heads for mixer in attention}
    if kv_heads and mesh.tp > min(kv_heads):
        if len(kv_heads) != 1:
            raise ValueError(f"TP = {mesh.tp} replicates key/value heads: it needs every layer's of one count, got {sorted(kv_heads)}")
        heads = min(kv_heads)
        peers = [rank for rank in range(mesh.tp) if rank * heads // mesh.tp == mesh.rank * heads // mesh.tp]
        for name in ("k_proj", "v_proj"):
            composed[name] = _kv_projection(ops[name], mesh, peers)
    for name in ROW_PARALLEL:
        if name not in ops or not global_k[name]:
            continue
        if len(global_k[name]) != 1:
            raise ValueError(f"tensor parallelism needs every layer's {name} of one width, got {sorted(global_k[name])}")
        entry = _entry_of(contract, name, case)
        impl = REGISTRY.get(entry.impl.id, entry.impl.version)
        composed[name] = _row_parallel(ops[name], impl, dict(entry.constants), mesh, leaves, next(iter(global_k[name])))
    return composed

