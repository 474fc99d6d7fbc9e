"""The MoE regions' references: admitted by the battery (tokens alone vs in batches of up to 200,
exact score ties, every token on one expert, idle experts), ties at the top-k boundary broken to the
lower expert id, and a batch-dependent expert GEMM (the control) rejected by the same battery."""

import torch

from conftest import preset_dict
from controls import control_moe_experts
from isoexec.contract import Contract, fit_contract, load_preset
from isoexec.model import PRESETS
from isoexec.ops.moe import reference
from isoexec.runtime.registry import REGISTRY
from isoexec.validate.battery import validate_entry

GEMM = dict(input_dtype="float32", weight_dtype="float32", accum_dtype="float32", block_k=16, block_tree="balanced_binary", tree="sequential")


def _validate(contract, region):
    return validate_entry(contract, contract.entry(region, "trainer_fwd"), REGISTRY.probe(region), registry=REGISTRY, device=torch.device("cpu"))


def test_the_battery_admits_every_moe_reference():
    contract = fit_contract(load_preset("tiny-moe"), PRESETS["tiny-moe"])
    for region in ("moe.router", "moe.experts", "moe.combine"):
        result = _validate(contract, region)
        assert result.status == "admitted" and result.trials > 40, (region, result.failures[:3])


def test_a_batch_dependent_expert_gemm_is_rejected():
    contract = Contract.from_dict(control_moe_experts(preset_dict("tiny-moe")))
    result = _validate(contract, "moe.experts")
    assert result.status == "rejected" and not any("raised" in f for f in result.failures), result.failures[:3]


def test_ties_at_the_top_k_boundary_go_to_the_lower_expert_id():
    """Experts 2 and 4 have the same gate row: every token scores them exactly alike, so whichever of
    them ranks k-th, the other never precedes it, alone or in any batch."""
    g = torch.Generator().manual_seed(0)
    gate = torch.randn(6, 32, generator=g)
    gate[4] = gate[2]
    x = torch.randn(300, 32, generator=g)
    for top_k in (1, 2, 3):
        _, ids = reference.router(x, gate, None, top_k, **GEMM)
        _, alone = reference.router(x[7:8], gate, None, top_k, **GEMM)
        assert torch.equal(ids[7:8], alone)
        both = (ids == 2).any(-1) & (ids == 4).any(-1)
        only_one = (ids == 2).any(-1) ^ (ids == 4).any(-1)
        assert not (ids == 4)[only_one].any(), "a tie went to the higher expert id"
        assert both.any() or only_one.any()


def test_combine_sums_in_ascending_expert_id_whatever_the_slot_order():
    g = torch.Generator().manual_seed(1)
    routed, weights = torch.randn(50, 3, 16, generator=g), torch.rand(50, 3, generator=g)
    ids = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(50)])
    constants = dict(input_dtype="float32", output_dtype="float32", accum_dtype="float32")
    out = reference.combine(routed, weights, ids, **constants)
    perm = torch.tensor([2, 0, 1])
    assert torch.equal(out.view(torch.int32), reference.combine(routed[:, perm], weights[:, perm], ids[:, perm], **constants).view(torch.int32))
    order = ids.argsort(-1)
    expected = torch.zeros(50, 16)
    for j in range(3):
        slot = order[:, j]
        expected = expected + routed[torch.arange(50), slot] * weights[torch.arange(50), slot, None]
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))
