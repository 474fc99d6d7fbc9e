"""Which part of each weight a tensor-parallel rank holds, and the model it runs.

Tensor parallelism cuts only where the contract's arithmetic is already cut, so that every TP size gives
the bits of one process:
- column-parallel projections (q/k/v, gate/up) by whole output columns: a column's bits never depend on
  the other columns. Attention's by whole heads: a rank's query heads and the key/value heads they read
  (replicated where TP exceeds the key/value heads);
- row-parallel projections (o_proj, down_proj) by whole K leaves of the contract's `num_leaves`: rank r of
  TP = C holds K columns [floor(rK/C), floor((r+1)K/C)), leaves [rG/C, (r+1)G/C) (`linear.reference`'s
  `leaf_bounds`), which are the columns its column-parallel half produced;
- everything else replicated: the embedding, the norms, lm_head and the log-probs.

The rank's model is the ordinary single-device `Decoder` built from its `local_spec` (fewer heads, a
narrower MLP) and loaded with its shards: model code never sees the layout. The ops that cross ranks
are composed around the contract's bound ops by `parallel/ops.py`.
"""

from __future__ import annotations

import dataclasses

import torch

from ..contract.values import ContractError
from ..model import AttentionSpec, Decoder, MLPSpec, ModelSpec
from ..ops.linear.reference import leaf_columns, rank_leaves

ROW_PARALLEL = ("o_proj", "down_proj")
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


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


def _leaves(contract, tp: int) -> int:
    """The leaves a rank's K columns are cut by: the contract's, or one per rank where it has none."""
    return num_leaves(contract) or tp


def check(spec: ModelSpec, contract, tp: int) -> None:
    """Refuse, in one line naming the reason, a TP size the model or the contract cannot be cut into."""
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tensor-parallel size must be a positive int, got {tp!r}")
    if tp == 1:
        return
    leaves = _leaves(contract, tp)
    if leaves % tp:
        raise ValueError(f"TP = {tp} does not divide contract {contract.name}'s {leaves} row-parallel leaves")
    for index, layer in enumerate(spec.layers):
        if not isinstance(layer.mixer, AttentionSpec) or not isinstance(layer.ffn, MLPSpec):
            raise ValueError(f"tensor parallelism shards gqa attention and mlp layers so far; layer {index} is "
                             f"{layer.mixer.kind} + {layer.ffn.kind}")
        heads, kv_heads = layer.mixer.num_heads, layer.mixer.num_kv_heads
        if heads % tp:
            raise ValueError(f"TP = {tp} does not divide layer {index}'s {heads} attention heads")
        if kv_heads % tp and tp % kv_heads:
            raise ValueError(f"TP = {tp} neither divides layer {index}'s {kv_heads} key/value heads nor is a multiple of them")
    claimed = contract.claims.topology.tp
    if contract.claims.is_bitwise and tp not in claimed:
        raise ValueError(f"contract {contract.name} claims its bits at TP {', '.join(map(str, claimed))} only (claims.topology.tp)")


def _heads(attention: AttentionSpec, tp: int, rank: int) -> tuple[range, range]:
    """Rank's query heads and the key/value heads they read."""
    per_rank = attention.num_heads // tp
    queries = range(rank * per_rank, (rank + 1) * per_rank)
    group = attention.num_heads // attention.num_kv_heads
    return queries, range(queries.start // group, (queries.stop - 1) // group + 1)


def local_spec(spec: ModelSpec, contract, tp: int, rank: int) -> ModelSpec:
    """The spec of rank's model: its heads and its slice of every MLP."""
    check(spec, contract, tp)
    leaves = _leaves(contract, tp)
    layers = []
    for layer in spec.layers:
        queries, kv = _heads(layer.mixer, tp, rank)
        mixer = dataclasses.replace(layer.mixer, num_heads=len(queries), num_kv_heads=len(kv))
        columns = leaf_columns(layer.ffn.intermediate_size, leaves, rank_leaves(leaves, rank, tp))
        ffn = dataclasses.replace(layer.ffn, intermediate_size=columns.stop - columns.start)
        layers.append(dataclasses.replace(layer, mixer=mixer, ffn=ffn))
    return dataclasses.replace(spec, layers=tuple(layers))


def _rows(weight: torch.Tensor, heads: range, rows_per_head: int) -> torch.Tensor:
    return weight[heads.start * rows_per_head : heads.stop * rows_per_head]


def shard(model: Decoder, contract, tp: int, rank: int) -> Decoder:
    """Rank's model: a `Decoder` of its `local_spec`, holding its shard of each of `model`'s weights."""
    spec = model.spec
    local = Decoder(local_spec(spec, contract, tp, rank))
    leaves = _leaves(contract, tp)
    full = model.state_dict()
    shards = {}
    for name, weight in full.items():
        parts = name.split(".")
        if parts[:2] != ["model", "layers"] or parts[3] not in ("self_attn", "mlp"):
            shards[name] = weight  # replicated
            continue
        layer = spec.layers[int(parts[2])]
        projection = parts[4]
        if parts[3] == "self_attn":
            attention = layer.mixer
            queries, kv = _heads(attention, tp, rank)
            per_head = attention.head_dim * (2 if attention.output_gate else 1)  # q_proj: each head's query, then gate
            if projection == "q_proj":
                shards[name] = _rows(weight, queries, per_head)
            elif projection in ("k_proj", "v_proj"):
                shards[name] = _rows(weight, kv, attention.head_dim)
            elif projection == "o_proj" and parts[-1] == "weight":
                shards[name] = weight[:, leaf_columns(weight.shape[1], leaves, rank_leaves(leaves, rank, tp))]
            else:  # q_norm / k_norm (per head dim) and o_proj's bias: replicated
                shards[name] = weight
        else:
            columns = leaf_columns(layer.ffn.intermediate_size, leaves, rank_leaves(leaves, rank, tp))
            shards[name] = weight[columns] if projection in ("gate_proj", "up_proj") else weight[:, columns]
    local.load_state_dict({name: t.clone() for name, t in shards.items()})
    local.unsharded_spec = spec  # what the composed ops need of the whole model (`parallel/ops.py`)
    return local
