"""Data parallelism for the trainer (isoexec.parallel.data), in real gloo processes on the CPU: each FSDP2 group
scores its share of the sequences, every rank returns every sequence's rows, bitwise equal to one process's
(with TP inside the groups too); gradients reduce-scattered by the collective match one process's; the audit
with a data-parallel trainer; the micro-batches dealt out evenly, whatever the lengths."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from conftest import int_view
from isoexec.audit import all_equal, run_audit
from isoexec.contract import fit_contract, load_preset
from isoexec.model import PRESETS, init_random
from isoexec.parallel import shard, spawn
from isoexec.parallel.data import dp_micro_batches
from isoexec.trainer import Trainer
from isoexec.trainer.score import micro_batches

SEQUENCES = [[(7 * i + 3 * j) % 500 for j in range(n)] for i, n in enumerate((9, 23, 40, 5, 17))]


def _differing(a, b) -> int:
    return sum(int((int_view(x) != int_view(y)).sum()) for x, y in zip(a, b))


def _run(mesh, contract_name, dtype="bfloat16"):
    """trainer_fwd's rows (micro-batches of 30 tokens: several a group) and, for an fp32 model, the gradients of a
    fixed weighting of them, each parameter whole."""
    spec = dataclasses.replace(PRESETS["tiny-dense"], dtype=dtype)
    contract = fit_contract(load_preset(contract_name), spec)
    model = init_random(spec, seed=0)
    trainer = Trainer(shard(model, contract, mesh) if mesh.world > 1 else model, contract, mesh)
    rows = trainer.logprobs(SEQUENCES, case="trainer_fwd", micro_batch_tokens=30)
    sum((r * torch.linspace(-1, 1, r.numel()).view_as(r)).sum() for r in rows).backward()
    grads, shards = {}, {}
    for name, p in trainer.model.named_parameters():
        grads[name] = (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float()
        shards[name] = tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)
    return [r.detach() for r in rows], grads, shards


def test_data_parallel_rows_are_one_process_bits():
    """Two groups of one rank, the parameters sharded over them by FSDP2: every sequence's trainer_fwd rows bit for
    bit (two groups of two tensor-parallel ranks: the audit below, both trainer cases against one engine). The
    control: native at TP 2 + DP 2 differs from native in one process (its row-parallel projections round twice)."""
    one, _, _ = spawn(1, _run, "tiny-dense")
    rows, _, _ = spawn(1, _run, "tiny-dense", dp=2)
    assert len(rows) == len(SEQUENCES)
    assert _differing(one, rows) == 0
    assert _differing(spawn(1, _run, "native")[0], spawn(2, _run, "native", dp=2)[0]) > 0


def test_fsdp_gradients_match_one_process():
    """DP 2 on an fp32 model: each rank holds half of every parameter's rows (FSDP2's dim-0 shards), and the
    gradients, reduce-scattered by the collective's sum, match one process's to float tolerance."""
    _, full, _ = spawn(1, _run, "tiny-dense", "float32")
    _, grads, shards = spawn(1, _run, "tiny-dense", "float32", dp=2)
    assert shards["model.layers.0.mlp.gate_proj.weight"] == (64, 64)  # 128 rows over two groups
    for name, want in full.items():
        assert grads[name].shape == want.shape, name
        assert float((grads[name] - want).norm() / want.norm()) < 1e-5, name


def _masters_step(mesh):
    """One AdamW step of float32 masters of a bfloat16 policy (`rl/precision.py`), the policy FSDP-sharded at DP > 1:
    each rank's shard of the masters before and after, and of the policy after."""
    from isoexec.rl.precision import MasterWeights

    model = init_random(PRESETS["tiny-dense"], seed=0)
    trainer = Trainer(model, load_preset("tiny-dense"), mesh)
    master = MasterWeights(trainer.model)
    local = lambda t: (t.to_local() if hasattr(t, "to_local") else t).detach().clone()  # noqa: E731
    before = {name: local(p) for name, p in master.named_parameters()}
    optimizer = torch.optim.AdamW(master.parameters(), lr=1e-3)
    rows = trainer.logprobs(SEQUENCES, case="trainer_fwd", micro_batch_tokens=30)
    sum((r.float() * torch.linspace(-1, 1, r.numel()).view_as(r)).sum() for r in rows).backward()
    master.take_grads()
    grads = sum(float(local(p.grad).double().pow(2).sum()) for _, p in master.named_parameters())
    optimizer.step()
    master.write_back()
    return before, {name: local(p) for name, p in master.named_parameters()}, {name: local(p) for name, p in trainer.model.named_parameters()}, grads


def test_float32_masters_step_the_fsdp_shards_of_a_bfloat16_policy():
    """With DP 2 the masters are DTensors over the groups like the policy's parameters: after a step every
    parameter's shard is the bfloat16 rounding of its master's, and every master moved."""
    before, masters, policy, grads = spawn(1, _masters_step, dp=2)
    assert grads > 0
    assert masters["model.layers.0.mlp.gate_proj.weight"].shape == (64, 64)  # half of 128 rows: a group's shard
    for name, master in masters.items():
        assert policy[name].dtype == torch.bfloat16 and master.dtype == torch.float32, name
        assert torch.equal(policy[name], master.to(torch.bfloat16)), name
        assert not torch.equal(master, before[name]), name


def test_the_audit_is_bitwise_with_a_data_parallel_trainer():
    model = init_random(PRESETS["tiny-dense"], seed=0)
    report = run_audit(model, load_preset("tiny-dense"), requests=6, max_new_tokens=8, progress=False, trainer_tp=2, trainer_dp=2)
    assert all_equal(report), report["trainer_score"]
    assert report["layout"]["trainer"] == {"tp": 2, "ep": 1, "sp": False, "dp": 2}


@pytest.mark.parametrize("lengths, budget, dp", [
    ([9, 23, 40, 5, 17], 30, 2), ([9, 23, 40, 5, 17], 1000, 2), ([9, 23, 40, 5, 17], 1000, 5), ([50, 50, 50], 10, 2),
    ([3] * 7, 6, 4), ([8, 1, 1, 1, 1], 9, 3),
])
def test_every_group_gets_as_many_micro_batches(lengths, budget, dp):
    """Split where micro-batches hold several sequences, merged where they hold one each; every sequence once."""
    shares = dp_micro_batches(lengths, budget, dp, micro_batches)
    assert len({len(share) for share in shares}) == 1 and all(share and all(share) for share in shares)
    assert sorted(i for share in shares for batch in share for i in batch) == list(range(len(lengths)))


def test_too_few_sequences_for_the_groups_are_refused():
    with pytest.raises(ValueError, match="DP = 4 needs at least 4 sequences a call, got 3"):
        dp_micro_batches([5, 5, 5], 100, 4, micro_batches)
    result = subprocess.run([sys.executable, "-m", "isoexec", "audit", "--trainer-dp", "5", "--requests", "4", "--quiet"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["isoexec: error: --trainer-dp 5: each data-parallel group scores at least one of "
                                                  "the 4 requests"]
