"""The cuts `parallel/weights.py` finds once and reuses: the same positions as cutting an index of the whole weight
for every layer and rank, and the norm's shares the same as counting every element's holders."""

import pytest
import torch

from isoexec.contract import fit_contract, load_preset
from isoexec.model.families import PRESETS
from isoexec.parallel import weights
from isoexec.parallel.mesh import Mesh
from isoexec.parallel.plan import shard_of

# TP 4 on tiny-dense copies its 2 key/value heads (each held by two ranks); EP 2 splits 3 layers' experts.
LAYOUTS = [("tiny-dense", "tiny-dense", 4, 1), ("tiny-moe", "tiny-moe", 2, 2), ("tiny-moe", "tiny-moe", 1, 2),
           ("tiny-hybrid", "tiny-hybrid", 2, 1), ("tiny-hybrid-moe", "tiny-hybrid", 2, 2)]


def _setup(model, contract, tp, ep):
    spec = PRESETS[model]
    return spec, fit_contract(load_preset(contract), spec, device="cpu"), Mesh(tp=tp, ep=ep, group=object())


@pytest.mark.parametrize("model,contract,tp,ep", LAYOUTS, ids=[f"{m}-tp{t}-ep{e}" for m, _, t, e in LAYOUTS])
def test_every_ranks_shard_goes_back_where_it_was_cut_from(model, contract, tp, ep):
    spec, contract, mesh = _setup(model, contract, tp, ep)
    runs = positions = 0
    for name, (shape, _) in weights.weight_shapes(spec).items():
        whole = torch.randn(shape)
        rebuilt = torch.full((shape.numel(),), float("nan"))
        for rank in range(mesh.world):
            shard = shard_of(name, whole, spec, contract, Mesh(tp=tp, ep=ep, rank=rank, group=object()))
            cut = weights._cut(name, shape, spec, contract, mesh, rank)
            assert torch.equal(torch.arange(shape.numel())[cut], weights._positions(name, shape, spec, contract, mesh, rank))
            rebuilt[cut] = shard.reshape(-1)
            runs, positions = runs + isinstance(cut, slice), positions + (not isinstance(cut, slice))
        assert torch.equal(rebuilt.view(torch.int32), whole.reshape(-1).view(torch.int32)), name
    assert runs and (positions or tp == 1)  # experts, row cuts and replicated weights are runs; TP's column cuts are not


def test_layers_of_one_kind_share_their_cut():
    spec, contract, mesh = _setup("tiny-moe", "tiny-moe", 2, 2)
    shape = weights.weight_shapes(spec)["model.layers.0.self_attn.o_proj.weight"][0]
    first, last = (weights._cut(f"model.layers.{i}.self_attn.o_proj.weight", shape, spec, contract, mesh, 1) for i in (0, 2))
    assert isinstance(first, torch.Tensor) and first is last


@pytest.mark.parametrize("model,contract,tp,ep", LAYOUTS, ids=[f"{m}-tp{t}-ep{e}" for m, _, t, e in LAYOUTS])
def test_the_norms_shares_count_each_elements_holders(model, contract, tp, ep):
    spec, contract, mesh = _setup(model, contract, tp, ep)
    copied = False
    for rank in range(mesh.world):
        norm = weights.GradNorm(spec, contract, Mesh(tp=tp, ep=ep, rank=rank, group=object()))
        for name, (shape, _) in weights.weight_shapes(spec).items():
            holders = torch.zeros(shape.numel())
            for other in range(mesh.world):
                holders[weights._positions(name, shape, spec, contract, mesh, other)] += 1
            want = 1.0 / holders[weights._positions(name, shape, spec, contract, mesh, rank)]
            got = torch.as_tensor(norm.shares[name]).expand(want.shape)
            assert torch.equal(got.contiguous().view(torch.int32), want.view(torch.int32)), name
            copied |= isinstance(norm.shares[name], float) and 0 < norm.shares[name] < 1
    assert copied  # some weight is held by several ranks (replicated norms at least), so shares below 1 are checked


def _gathered(mesh, model, contract_name):
    """On every rank: the same whole state (float32 and bfloat16 weights alike, so runs of 2- and 4-byte elements
    share the buffer), cut to this rank's shards and gathered back on rank 0, each in its shards' dtype (a bfloat16
    model's float32 masters and moments come back float32)."""
    spec = PRESETS[model]
    contract = fit_contract(load_preset(contract_name), spec, device="cpu")
    g = torch.Generator().manual_seed(0)
    whole = {name: torch.randn(shape, generator=g).to(torch.bfloat16 if i % 2 else torch.float32)
             for i, (name, (shape, _)) in enumerate(weights.weight_shapes(spec).items())}
    local = {name: shard_of(name, t, spec, contract, mesh).clone() for name, t in whole.items()}
    back = weights.unshard_state(local, spec, contract, mesh, first_only=True)
    return {name: (t, whole[name]) for name, t in back.items()} if mesh.rank == 0 else back


def test_a_bucket_gathered_on_the_first_rank_is_the_whole_state():
    from isoexec.parallel.mesh import spawn

    pairs = spawn(2, _gathered, "tiny-moe", "tiny-moe", ep=2)
    assert len(pairs) == len(weights.weight_shapes(PRESETS["tiny-moe"]))
    for name, (got, want) in pairs.items():
        width = torch.int16 if want.dtype == torch.bfloat16 else torch.int32
        assert got.dtype == want.dtype and torch.equal(got.view(width), want.view(width)), name
