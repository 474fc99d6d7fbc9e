"""Which part of each weight a rank holds, and the model it runs.

Tensor parallelism (TP) and expert parallelism (EP) cut only where the contract's arithmetic is already cut,
so that every layout gives the bits of one process:
- column-parallel projections (q/k/v, gate/up of a dense MLP) by whole output columns: a column's bits never
  depend on the other columns. Attention's by whole heads: a rank's query heads and the key/value heads they
  read (replicated where TP exceeds the key/value heads). A Gated DeltaNet layer's by whole key heads and the
  value heads that read them (TP divides the key heads): in_proj_qkv's and the conv's rows of the rank's q, k
  and v heads, in_proj_z / in_proj_b / in_proj_a, A_log and dt_bias by value heads; the conv is per channel and
  the delta rule per value head, so each runs on the rank's heads alone;
- row-parallel projections (o_proj, GDN's out_proj, down_proj of a dense MLP) by whole K leaves of the contract's
  `num_leaves`: rank r of TP = C holds K columns [floor(rK/C), floor((r+1)K/C)), leaves [rG/C, (r+1)G/C)
  (`linear.reference`'s `leaf_bounds`), which are the columns its column-parallel half produced;
- routed experts by whole experts: rank r of EP = P holds experts [floor(rE/P), floor((r+1)E/P)) (uneven
  where P does not divide E); a (token, slot)'s output depends only on its own row and its expert (the
  experts op's invariance). r is the rank in the model group, or, where EP spans the side (EP = TP x DP), in
  the side: group d's rank t is EP rank d * TP + t (`Mesh.ep_rank`);
- the vocabulary (the embedding's rows, lm_head's rows, the log-probs' columns) by whole blocks of the
  contract's log-probs `vocab_block`: rank r of TP = C holds blocks [floor(rB/C), floor((r+1)B/C)) of the B,
  whose per-block maxima and sums are the leaves of the log-softmax's fold (`vocab_shards`);
- shared experts as a dense MLP (their columns on the same leaves; the dense MLP's ops run them);
- everything else replicated: the norms, the router, the shared experts' gate.

The rank's model is the ordinary single-device `Decoder` built from its `local_spec` (fewer heads, a narrower
MLP) and loaded with its shards (a rank's routed experts are its expert tensors' first dim): model code never
sees the layout. The ops that cross ranks are composed around the contract's bound ops by `parallel/ops.py`.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ..contract.values import ContractError
from ..model import AttentionSpec, Decoder, GDNSpec, MLPSpec, ModelSpec, MoESpec
from ..ops.linear.reference import leaf_columns, rank_leaves
from ..runtime.registry import REGISTRY
from .mesh import Mesh, world_of

ROW_PARALLEL = ("o_proj", "out_proj", "down_proj")
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


def num_leaves(contract) -> int | None:
    """The contract's row-parallel leaf count (one for every case and entry, or a ContractError); None for a
    contract without leaves (`native`: o_proj and down_proj are plain linears, summed by the collective)."""
    counts = {entry.constants.get("num_leaves") for entry in contract.composition if entry.region == "linear.row_parallel"}
    if not counts:
        return None
    if len(counts) != 1 or None in counts:
        raise ContractError("composition", f"contract {contract.name}: tensor parallelism needs one num_leaves for its row-parallel "
                            f"entries, found {sorted(map(str, counts))}")
    return counts.pop()


def vocab_block(contract) -> int | None:
    """The contract's log-probs vocab block (one for every case, or a ContractError); None for a contract whose
    log-probs have no blocks (`native`'s log_softmax)."""
    blocks = {entry.constants.get("vocab_block") for entry in contract.composition if entry.region == "logprobs"}
    if len(blocks) > 1:
        raise ContractError("composition", f"contract {contract.name}: tensor parallelism needs one vocab_block for its log-probs "
                            f"entries, found {sorted(map(str, blocks))}")
    return blocks.pop() if blocks else None


def vocab_shards(vocab_size: int, contract, tp: int) -> list[slice]:
    """Every rank's vocabulary columns at TP `tp`: whole `vocab_block`s, rank r's blocks [floor(rB/tp), floor((r+1)B/tp))
    (a contract without blocks: columns [floor(rV/tp), floor((r+1)V/tp))). Where TP exceeds the B blocks some ranks hold
    none (a small vocabulary: the toy task's 13 tokens are one block)."""
    block = vocab_block(contract) or 1
    blocks = -(-vocab_size // block)
    return [slice(min(vocab_size, (r * blocks // tp) * block), min(vocab_size, ((r + 1) * blocks // tp) * block)) for r in range(tp)]


def _leaves(contract, tp: int) -> int:
    """The leaves a rank's K columns are cut by: the contract's, or one per rank where it has none."""
    return num_leaves(contract) or tp


def check(spec: ModelSpec, contract, tp: int, ep: int = 1, sp: bool = False, dp: int = 1) -> None:
    """Refuse, in one line naming the reason, a layout the model or the contract cannot be cut into."""
    world_of(tp, ep, dp)
    if sp and tp == 1:
        raise ValueError("sequence parallelism cuts the tokens over the tensor-parallel ranks: it needs TP > 1")
    moe = [index for index, layer in enumerate(spec.layers) if isinstance(layer.ffn, MoESpec)]
    if ep > 1 and not moe:
        raise ValueError(f"EP = {ep} needs routed experts, and {spec.architecture} has no MoE layer")
    leaves = _leaves(contract, tp)
    if tp > 1 and leaves % tp:
        raise ValueError(f"TP = {tp} does not divide contract {contract.name}'s {leaves} row-parallel leaves")
    if tp > 1 and contract.claims.is_bitwise:
        _check_parts(contract)
    for index, layer in enumerate(spec.layers if max(tp, ep) > 1 else ()):
        if not isinstance(layer.mixer, (AttentionSpec, GDNSpec)) or not isinstance(layer.ffn, (MLPSpec, MoESpec)):
            raise ValueError(f"tensor and expert parallelism shard gqa attention, gdn, mlp and moe layers so far; layer {index} is "
                             f"{layer.mixer.kind} + {layer.ffn.kind}")
        if isinstance(layer.mixer, GDNSpec):
            if layer.mixer.num_k_heads % tp:
                raise ValueError(f"TP = {tp} does not divide layer {index}'s {layer.mixer.num_k_heads} Gated DeltaNet key heads")
        elif layer.mixer.num_heads % tp:
            raise ValueError(f"TP = {tp} does not divide layer {index}'s {layer.mixer.num_heads} attention heads")
        elif layer.mixer.num_kv_heads % tp and tp % layer.mixer.num_kv_heads:
            raise ValueError(f"TP = {tp} neither divides layer {index}'s {layer.mixer.num_kv_heads} key/value heads nor is a multiple of them")
        if isinstance(layer.ffn, MoESpec) and layer.ffn.num_experts < ep:
            raise ValueError(f"EP = {ep} exceeds layer {index}'s {layer.ffn.num_experts} experts")
    widths = {layer.ffn.intermediate_size if isinstance(layer.ffn, MLPSpec) else layer.ffn.shared_intermediate_size
              for layer in spec.layers if isinstance(layer.ffn, MLPSpec) or getattr(layer.ffn, "shared_intermediate_size", 0)}
    if tp > 1 and len(widths) > 1:
        raise ValueError(f"TP = {tp} cuts the dense MLPs and shared experts by one down_proj width (the row-parallel op's K), "
                         f"and {spec.architecture} has {', '.join(map(str, sorted(widths)))}")
    topology = contract.claims.topology
    for name, size in (("tp", tp), ("ep", ep), ("sp", sp)):
        claimed = getattr(topology, name)
        if contract.claims.is_bitwise and size not in claimed:
            raise ValueError(f"contract {contract.name} claims its bits at {name.upper()} {', '.join(map(str, claimed))} only "
                             f"(claims.topology.{name})")


def _check_parts(contract) -> None:
    """A bitwise contract cut by TP needs the halves its cuts run (`Impl.leaf_parts`, `Impl.vocab_parallel`)."""
    for entry in contract.composition:
        impl = REGISTRY.get(entry.impl.id, entry.impl.version)
        missing = {"linear.row_parallel": impl.leaf_parts is None and "leaf parts",
                   "logprobs": impl.vocab_parallel is None and "vocabulary-parallel form"}.get(entry.region)
        if missing:
            raise ValueError(f"{impl.ref} ({entry.region} of contract {contract.name}) has no {missing}: tensor parallelism "
                             "would not give its bits")


def _heads(attention: AttentionSpec, tp: int, rank: int) -> tuple[range, range]:
    """Rank's query heads and the key/value heads they read."""
    per_rank = attention.num_heads // tp
    queries = range(rank * per_rank, (rank + 1) * per_rank)
    group = attention.num_heads // attention.num_kv_heads
    return queries, range(queries.start // group, (queries.stop - 1) // group + 1)


def _gdn_heads(gdn: GDNSpec, tp: int, rank: int) -> tuple[range, range]:
    """Rank's Gated DeltaNet key heads and the value heads that read them (value head j reads key head j // (Hv / Hk))."""
    keys, values = gdn.num_k_heads // tp, gdn.num_v_heads // tp
    return range(rank * keys, (rank + 1) * keys), range(rank * values, (rank + 1) * values)


def _rank_columns(intermediate: int, leaves: int, mesh: Mesh) -> slice:
    return leaf_columns(intermediate, leaves, rank_leaves(leaves, mesh.rank if mesh.tp > 1 else 0, mesh.tp))


def local_spec(spec: ModelSpec, contract, mesh: Mesh) -> ModelSpec:
    """The spec of a rank's model: its heads and its slice of every dense MLP and shared expert (an MoE layer's
    routed experts stay whole in the spec: its router sees every expert)."""
    check(spec, contract, mesh.tp, mesh.ep, dp=mesh.dp)
    leaves, tp_rank = _leaves(contract, mesh.tp), mesh.rank if mesh.tp > 1 else 0
    layers = []
    for layer in spec.layers:
        if isinstance(layer.mixer, GDNSpec):
            keys, values = _gdn_heads(layer.mixer, mesh.tp, tp_rank)
            mixer = dataclasses.replace(layer.mixer, num_k_heads=len(keys), num_v_heads=len(values))
        else:
            queries, kv = _heads(layer.mixer, mesh.tp, tp_rank)
            mixer = dataclasses.replace(layer.mixer, num_heads=len(queries), num_kv_heads=len(kv))
        ffn = layer.ffn
        if isinstance(ffn, MLPSpec):
            columns = _rank_columns(ffn.intermediate_size, leaves, mesh)
            ffn = dataclasses.replace(ffn, intermediate_size=columns.stop - columns.start)
        elif isinstance(ffn, MoESpec) and ffn.shared_intermediate_size:
            columns = _rank_columns(ffn.shared_intermediate_size, leaves, mesh)
            ffn = dataclasses.replace(ffn, shared_intermediate_size=columns.stop - columns.start)
        layers.append(dataclasses.replace(layer, mixer=mixer, ffn=ffn))
    return dataclasses.replace(spec, layers=tuple(layers))


def _rows(weight: torch.Tensor, heads: range, rows_per_head: int) -> torch.Tensor:
    return weight[heads.start * rows_per_head : heads.stop * rows_per_head]


def expert_starts(num_experts: int, ep: int) -> list[int]:
    """The first expert of each rank of EP = `ep`, and the count after the last: rank r holds
    [starts[r], starts[r + 1])."""
    return [r * num_experts // ep for r in range(ep + 1)]


def experts_of(layer_spec, mesh: Mesh) -> range:
    """The routed experts a rank of `mesh` holds in an MoE layer."""
    if mesh.ep == 1:
        return range(layer_spec.ffn.num_experts)
    starts = expert_starts(layer_spec.ffn.num_experts, mesh.ep)
    return range(starts[mesh.ep_rank], starts[mesh.ep_rank + 1])


def spread_over_side(name: str, mesh: Mesh) -> bool:
    """Whether weight `name` is a routed experts' tensor cut over every rank of the side (EP spanning the groups):
    no two groups hold the same elements, so data parallelism does not shard or reduce it."""
    return mesh.ep_spans_groups and ".mlp.experts." in name


def shard_of(name: str, weight: torch.Tensor, spec: ModelSpec, contract, mesh: Mesh) -> torch.Tensor:
    """The part of the whole model's weight `name` a rank of `mesh` holds."""
    leaves = _leaves(contract, mesh.tp)
    parts = name.split(".")
    if name in ("model.embed_tokens.weight", "lm_head.weight") and mesh.tp > 1:
        return weight[vocab_shards(spec.vocab_size, contract, mesh.tp)[mesh.rank]]
    if parts[:2] != ["model", "layers"]:
        return weight  # the final norm
    layer = spec.layers[int(parts[2])]
    owner, projection = parts[3], parts[4] if len(parts) > 4 else ""
    if owner == "self_attn":
        attention = layer.mixer
        queries, kv = _heads(attention, mesh.tp, mesh.rank if mesh.tp > 1 else 0)
        per_head = attention.head_dim * (2 if attention.output_gate else 1)  # q_proj: each head's query, then gate
        if projection == "q_proj":
            return _rows(weight, queries, per_head)
        if projection in ("k_proj", "v_proj"):
            return _rows(weight, kv, attention.head_dim)
        if projection == "o_proj" and parts[-1] == "weight":
            return weight[:, _rank_columns(weight.shape[1], leaves, mesh)]
        return weight  # q_norm / k_norm (per head dim) and o_proj's bias
    if owner == "linear_attn":
        return _gdn_shard(projection, weight, layer.mixer, leaves, mesh)
    if owner == "mlp" and isinstance(layer.ffn, MLPSpec):
        columns = _rank_columns(layer.ffn.intermediate_size, leaves, mesh)
        return weight[columns] if projection in ("gate_proj", "up_proj") else weight[:, columns]
    if owner == "mlp" and projection in ("shared_expert", "shared_experts"):  # a dense MLP of the shared width
        columns = _rank_columns(layer.ffn.shared_intermediate_size, leaves, mesh)
        return weight[columns] if parts[5] in ("gate_proj", "up_proj") else weight[:, columns]
    if owner == "mlp" and projection == "experts":
        experts = experts_of(layer, mesh)
        return weight[experts.start : experts.stop]
    return weight  # the layer norms, the router, the shared experts' gate


def _gdn_shard(name: str, weight: torch.Tensor, gdn: GDNSpec, leaves: int, mesh: Mesh) -> torch.Tensor:
    """A rank's part of a Gated DeltaNet layer's weight `name` (its attribute: in_proj_qkv, conv1d, A_log, …)."""
    keys, values = _gdn_heads(gdn, mesh.tp, mesh.rank if mesh.tp > 1 else 0)
    if name in ("in_proj_qkv", "conv1d"):  # rows: q's heads, k's heads, then v's
        q = _rows(weight, keys, gdn.k_head_dim)
        k = _rows(weight[gdn.key_dim :], keys, gdn.k_head_dim)
        return torch.cat([q, k, _rows(weight[2 * gdn.key_dim :], values, gdn.v_head_dim)])
    if name == "in_proj_z":
        return _rows(weight, values, gdn.v_head_dim)
    if name in ("in_proj_b", "in_proj_a", "A_log", "dt_bias"):
        return _rows(weight, values, 1)
    if name == "out_proj":
        return weight[:, _rank_columns(weight.shape[1], leaves, mesh)]
    return weight  # the gated norm's weight (per value head dim)


def shard_state(state: dict, spec: ModelSpec, contract, mesh: Mesh) -> dict:
    """A rank's part of every weight of a whole model's state dict."""
    return {name: shard_of(name, weight, spec, contract, mesh) for name, weight in state.items()}


def shard(model: Decoder, contract, mesh: Mesh) -> Decoder:
    """A rank's model: a `Decoder` of its `local_spec`, holding its shard of each of `model`'s weights."""
    return _local_model(model.spec, shard_state(model.state_dict(), model.spec, contract, mesh), contract, mesh)


def random_shard(spec: ModelSpec, seed: int, contract, mesh: Mesh) -> Decoder:
    """`shard(init_random(spec, seed), contract, mesh)`, bit for bit, without the whole model: each weight is drawn
    as `init_random` draws it (`random_weights`, on the rank's cores), cut to the rank's shard and let go, so a rank
    holds one whole weight at a time (every rank of a 35B-parameter model holding all of it would not fit a host)."""
    from ..model.weights import random_weights

    shards = {}
    for name, values in random_weights(spec, seed):
        shards[name] = shard_of(name, values, spec, contract, mesh).clone()
        if name == "model.embed_tokens.weight" and spec.tie_word_embeddings:  # lm_head is the same tensor, cut as lm_head
            shards["lm_head.weight"] = shard_of("lm_head.weight", values, spec, contract, mesh).clone()
    return _local_model(spec, shards, contract, mesh)


def _local_model(spec: ModelSpec, shards: dict, contract, mesh: Mesh) -> Decoder:
    local = Decoder(local_spec(spec, contract, mesh))
    if mesh.tp > 1:  # the rank's vocabulary rows only (lm_head the same tensor again where tied)
        local.model.embed_tokens.weight = nn.Parameter(torch.empty_like(shards["model.embed_tokens.weight"]))
        local.lm_head.weight = local.model.embed_tokens.weight if spec.tie_word_embeddings else nn.Parameter(
            torch.empty_like(shards["lm_head.weight"]))
    for index, layer in enumerate(spec.layers):
        if isinstance(layer.ffn, MoESpec) and mesh.ep > 1:  # the rank's experts only: its expert tensors are shorter
            experts = local.model.layers[index].mlp.experts
            for name in ("gate_up_proj", "down_proj"):
                setattr(experts, name, nn.Parameter(torch.empty_like(shards[f"model.layers.{index}.mlp.experts.{name}"])))
    local.load_state_dict({name: t.clone() for name, t in shards.items()})
    local.unsharded_spec = spec  # what the composed ops need of the whole model (`parallel/ops.py`)
    return local
