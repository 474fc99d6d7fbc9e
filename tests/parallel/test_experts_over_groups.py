"""Expert parallelism over every rank of a data-parallel side (EP = TP x DP: SkyRL-IsoExec's trainer TP 4 / EP 8 on 8
GPUs, and its mirror's engine TP 4 / EP 8), in real gloo processes on the CPU at TP 2 / EP 4 / DP 2: tiny-moe's 6
experts cut 1 + 2 + 1 + 2 over the four ranks of both groups, each group's pairs sent to the other group's experts and
back. The trainer's rows bitwise equal to one process's (with SP too; native at the same layout differs); the whole
gradient, the whole weights and the gradient norm put together from the shards match one process's; the engine's
replicas in lockstep, a replica with nothing to run computing a padding row; the audits and the RL gate bitwise, and a
resumed run the uninterrupted one; bad sizes refused in one line."""

import dataclasses

import pytest
import torch
import torch.distributed as dist

from conftest import int_view, isoexec_here
from isoexec.audit import all_equal, run_audit
from isoexec.contract import fit_contract, load_preset
from isoexec.model import PRESETS, init_random
from isoexec.parallel import shard, spawn, world_of
from isoexec.parallel.plan import experts_of
from isoexec.parallel.weights import GradNorm, unshard_state
from isoexec.rl.config import RLConfig
from isoexec.rl.train import train
from isoexec.trainer import Trainer

SEQUENCES = [[(7 * i + 3 * j) % 500 for j in range(n)] for i, n in enumerate((9, 23, 40, 5, 17))]
LAYOUT = dict(ep=4, dp=2)  # with TP 2


def _differing(a, b) -> int:
    return sum(int((int_view(x) != int_view(y)).sum()) for x, y in zip(a, b))


def _trainer(mesh, contract_name, dtype="bfloat16"):
    spec = dataclasses.replace(PRESETS["tiny-moe"], dtype=dtype)
    contract = fit_contract(load_preset(contract_name), spec)
    model = init_random(spec, seed=0)
    local = shard(model, contract, mesh) if mesh.world * mesh.dp > 1 else model
    return Trainer(local, contract, mesh), model, spec, contract


def _rows(mesh, contract_name):
    """trainer_fwd's rows (micro-batches of 30 tokens: several a group) and, on a parallel side, the experts every
    rank holds, in the side's rank order."""
    trainer, model, spec, _ = _trainer(mesh, contract_name)
    rows = [r.detach() for r in trainer.logprobs(SEQUENCES, case="trainer_fwd", micro_batch_tokens=30)]
    held = None
    if dist.is_initialized():
        held = [None] * dist.get_world_size()
        dist.all_gather_object(held, experts_of(spec.layers[1], mesh))
    return rows, held


@pytest.mark.parametrize("sp", [False, True], ids=["tp2-ep4-dp2", "tp2-ep4-dp2-sp"])
def test_rows_are_one_process_bits_with_the_experts_over_every_group(sp):
    """Without SP each group's tokens are shared out over its two ranks, whose pairs go to their experts' ranks in
    both groups; with SP each rank's own tokens' pairs do. The control: native at the same layout (its row-parallel
    projections rounded per rank, then summed) differs from native in one process."""
    one, _ = spawn(1, _rows, "tiny-moe")
    rows, held = spawn(2, _rows, "tiny-moe", sp=sp, **LAYOUT)
    assert held == [range(0, 1), range(1, 3), range(3, 4), range(4, 6)]  # ranks 2 and 3 are the second group's
    assert len(rows) == len(SEQUENCES)
    assert _differing(one, rows) == 0
    if not sp:
        assert _differing(spawn(1, _rows, "native")[0], spawn(2, _rows, "native", **LAYOUT)[0]) > 0


def _whole(mesh):
    """An fp32 model's whole gradient of a fixed weighting of its rows, its whole weights and the gradient norm, put
    together from the shards (`unshard_state`, `GradNorm`) as the RL loop does."""
    trainer, model, spec, contract = _trainer(mesh, "tiny-moe", "float32")
    rows = trainer.logprobs(SEQUENCES, case="trainer_fwd", micro_batch_tokens=30)
    sum((r * torch.linspace(-1, 1, r.numel()).view_as(r)).sum() for r in rows).backward()
    named = list(trainer.model.named_parameters())
    if mesh.world * mesh.dp == 1:
        grads = {name: p.grad for name, p in named}
        return grads, float(torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1e9)), True
    grads = unshard_state({name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p in named}, spec, contract, mesh)
    weights = unshard_state(trainer.model.state_dict(), spec, contract, mesh)
    same = all(torch.equal(weights[name], t) for name, t in model.state_dict().items())
    return grads, float(GradNorm(spec, contract, mesh).clip(named, 1e9)), same


def test_gradients_weights_and_norm_match_one_process():
    """Every parameter's whole gradient within 1e-5 of one process's (the experts' from both groups' pairs, summed
    on their rank by the backward's all-to-all; FSDP leaves them out), the whole weights bit for bit, and the norm,
    each expert counted once: the experts carry about 0.6% of the squared norm here, so counting them twice or not
    at all would move it by ~3e-3."""
    full, norm, _ = spawn(1, _whole)
    grads, parallel_norm, same = spawn(2, _whole, **LAYOUT)
    assert same
    assert grads.keys() == full.keys()
    for name, want in full.items():
        assert float((grads[name] - want).norm() / want.norm()) < 1e-5, name
    assert abs(parallel_norm / norm - 1) < 1e-5


@pytest.mark.parametrize("preset, contract, engine, trainer", [
    ("tiny-moe", "tiny-moe", dict(engine_tp=2, engine_ep=4, engine_dp=2), dict(trainer_tp=4, trainer_ep=4)),
    ("tiny-hybrid-moe", "tiny-hybrid", dict(engine_tp=2, engine_ep=4, engine_dp=2, engine_sp=True), dict(trainer_tp=2, trainer_ep=4, trainer_dp=2)),
], ids=["engine-tp2-ep4-dp2-vs-tp4-ep4", "hybrid-both-sides-over-the-groups"])
def test_the_engines_replicas_step_together_bitwise(preset, contract, engine, trainer):
    """The mirror of SkyRL-IsoExec's layout at a CPU's scale (engine TP 2 / EP 4 / DP 2, trainer TP 4 / EP 4), and a
    hybrid model with both sides over the groups (the engine under SP: the Gated DeltaNet state of the padding row's
    slot too). Five requests split 3 + 2, so a replica runs padding rows while the other still has work."""
    model = init_random(PRESETS[preset], seed=0)
    report = run_audit(model, load_preset(contract), requests=5, max_new_tokens=6, progress=False, **engine, **trainer)
    assert all_equal(report), report["trainer_score"]
    assert report["engine"]["idle_forwards"] > 0
    assert report["layout"]["engine"] == {"tp": 2, "ep": 4, "sp": engine.get("engine_sp", False), "dp": 2}


def test_engine_replicas_with_their_own_experts_run_alone_and_native_differs():
    """EP within each replica (TP 2 / EP 2 / DP 2): the replicas never meet, no padding rows; native at the replicas
    in lockstep (TP 2 / EP 4 / DP 2; its row-parallel projections rounded per rank) differs from its one process."""
    model = init_random(PRESETS["tiny-moe"], seed=0)
    report = run_audit(model, load_preset("tiny-moe"), requests=5, max_new_tokens=6, progress=False, engine_tp=2, engine_ep=2, engine_dp=2)
    assert all_equal(report) and report["engine"]["idle_forwards"] == 0
    native = run_audit(model, load_preset("native"), requests=5, max_new_tokens=6, progress=False, engine_tp=2, engine_ep=4, engine_dp=2)
    assert native["trainer_score"]["bitwise_equal_tokens"] < native["trainer_score"]["tokens"]


def _without_timings(history):
    return [{k: v for k, v in metrics.items() if not k.endswith("_seconds")} for metrics in history]


def test_the_rl_gate_holds_and_a_resumed_run_is_the_uninterrupted_one(tmp_path):
    """RL steps on a bfloat16 tiny-moe (float32 masters of the FSDP shards and of the experts) with each side at TP 2 /
    EP 4 / DP 2: bitwise on every step, the weights the engine put together from its shards the trainer's. A run
    stopped after its first step and resumed from its checkpoint (the whole policy, masters and AdamW state put
    together from the trainer's shards, cut again for its ranks at the start) ends with the uninterrupted run's
    metrics and weights, bit for bit."""
    small = dict(steps=2, prompts_per_step=3, group_size=2, warmup_steps=3, max_new_tokens=4, model="tiny-moe", dtype="bfloat16",
                 trainer_tp=2, trainer_ep=4, trainer_dp=2, engine_tp=2, engine_ep=4, engine_dp=2)
    whole = train(RLConfig(**small, checkpoint_dir=str(tmp_path / "whole")), progress=False)
    assert [(m["bitwise_equal_fraction"], m["full_vocab_rows_bitwise_equal_fraction"]) for m in whole.history] == [(1.0, 1.0)] * 2
    assert whole.history[-1]["weights_sha256"] == whole.weights
    train(RLConfig(**{**small, "steps": 1}, checkpoint_dir=str(tmp_path / "stopped")), progress=False)
    resumed = train(RLConfig(**small, checkpoint_dir=str(tmp_path / "stopped")), progress=False)
    assert _without_timings(resumed.history) == _without_timings(whole.history)
    assert resumed.weights == whole.weights


def test_sizes_that_do_not_span_the_groups_are_refused_in_one_line(capsys):
    assert world_of(2, 4, 2) == 2 and world_of(4, 8, 2) == 4 and world_of(2, 2, 2) == 2
    with pytest.raises(ValueError, match=r"or EP = TP x DP = 4 \(the experts over every group\), got tp = 2, ep = 8"):
        world_of(2, 8, 2)
    with pytest.raises(ValueError, match="each is 1 or both are equal, got tp = 2, ep = 4"):
        world_of(2, 4, 1)
    for side in ("trainer", "engine"):
        with pytest.raises(ValueError, match=rf"^{side}_tp 2, {side}_ep 8, {side}_dp 2: tp and ep span the same ranks: each is 1 or both "
                                             r"are equal, or EP = TP x DP = 4 \(the experts over every group\), got tp = 2, ep = 8$"):
            RLConfig(**{f"{side}_tp": 2, f"{side}_ep": 8, f"{side}_dp": 2})
    for side in ("trainer", "engine"):
        result = isoexec_here(capsys, "audit", "--model", "tiny-moe", f"--{side}-tp", "2", f"--{side}-ep", "8", f"--{side}-dp", "2")
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [f"isoexec: error: --{side}-tp 2 --{side}-ep 8 --{side}-dp 2: tp and ep span the "
                                                      "same ranks: each is 1 or both are equal, or EP = TP x DP = 4 (the experts over "
                                                      "every group), got tp = 2, ep = 8"]
