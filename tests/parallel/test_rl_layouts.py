"""The RL loop with each side at its own layout (isoexec.rl.parallel_mode): the trainer and the engine in
processes of their own on the CPU (gloo), the weights put together from the trainer's shards and cut again for
the engine's every step, the SHA-256 of the whole weights equal on both sides, the gate bitwise on every step under
the contract and measuring a mismatch under native; layouts that cannot run refused in one line."""

import os

import pytest

from conftest import isoexec_here
from isoexec.rl.config import RLConfig
from isoexec.rl.loop import RLRun
from isoexec.rl.parallel_mode import start_run

SMALL = dict(steps=2, prompts_per_step=3, group_size=2, warmup_steps=3, max_new_tokens=4)


def _ray_run(config):
    from isoexec.rl.ray_mode import ray_parallel_run

    return ray_parallel_run(config)


def _steps(config, ray=False):
    """The config's steps at its layouts: each side's ranks as processes of their own, or as Ray actors."""
    if ray:
        ray_module = pytest.importorskip("ray")
        ray_module.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        run = _ray_run(config) if ray else start_run(config)
        try:
            history = [run.run_step() for _ in range(config.steps)]
            sent = run.learner.weights()[1]
            pids = [run.learner.group.pids(), run.rollout.group.pids()] if ray else None
        finally:
            run.close()
    finally:
        if ray:
            ray_module.shutdown()
    return history, sent, run, pids


@pytest.mark.parametrize("layout, ray", [(dict(trainer_tp=2), True), (dict(engine_tp=2, engine_sp=True, trainer_dp=2), False)],
                         ids=["trainer-tp2-on-ray", "engine-tp2-sp-trainer-dp2"])
def test_the_gate_holds_with_each_side_at_its_own_layout(layout, ray):
    """The toy's 13 tokens are one vocabulary block, so at TP 2 one rank holds all of it and the other none. Every
    step's trainer log-probs and full rows are the rollout's bit for bit; each sync's digest is the SHA-256 of the
    whole weights the engine put together from its shards, equal to the trainer's; step 0 (same start, no update
    yet) draws exactly what an in-process run draws. The first layout runs on Ray (`rl/ray_mode.py`): each side's
    ranks are actors in processes of their own, reserved together in a placement group; the second in processes
    `isoexec train` starts (`parallel.RankGroup`); each rank computes on one thread either way."""
    config = RLConfig(**SMALL, **layout)
    history, sent, run, pids = _steps(config, ray=ray)
    assert [m["bitwise_equal_fraction"] for m in history] == [1.0, 1.0]
    assert [m["full_vocab_rows_bitwise_equal_fraction"] for m in history] == [1.0, 1.0]
    assert history[-1]["weights_sha256"] == sent == run.weights
    assert run.layout == {"trainer": config.layout("trainer"), "engine": config.layout("engine") | {"dp": 1}}  # as each rank 0 ran
    one = RLRun(RLConfig(**SMALL)).run_step()
    assert {k: one[k] for k in ("reward", "accuracy", "tokens")} == {k: history[0][k] for k in ("reward", "accuracy", "tokens")}
    if ray:
        assert [len(set(side)) for side in pids] == [2, 1] and os.getpid() not in {*pids[0], *pids[1]}


def test_native_at_a_parallel_layout_is_measured_not_equal():
    """The control: native's trainer at TP 2 (each rank's row-parallel GEMM rounded, then summed by the collective)
    against its engine at TP 1."""
    history, *_ = _steps(RLConfig(**SMALL, trainer_tp=2, contract="native"))
    assert min(m["bitwise_equal_fraction"] for m in history) < 1


@pytest.mark.parametrize("flags, message", [
    (["--trainer-tp", "3"], "trainer layout: TP = 3 does not divide contract tiny-dense's 8 row-parallel leaves"),
    (["--engine-ep", "2"], "engine layout: EP = 2 needs routed experts, and Qwen3ForCausalLM has no MoE layer"),
])
def test_bad_layouts_are_refused_in_one_line(flags, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where a refused run would have written its checkpoints
    result = isoexec_here(capsys, "train", "--quiet", *flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"isoexec: error: {message}"), lines


def test_without_a_warm_up_each_rank_draws_its_own_shard():
    """No warm-up, a model preset: the driver builds no model, each rank draws its shard of the seeded random
    weights (`parallel.random_shard`), and the whole weights the trainer's ranks put together for the first sync
    have the SHA-256 of an in-process run's, which built the model whole."""
    config = RLConfig(**{**SMALL, "warmup_steps": 0, "steps": 1}, algorithm="grpo", model="tiny-moe", trainer_tp=2, trainer_ep=2, engine_ep=2)
    run = start_run(config)
    try:
        assert run.send_weights is not None  # rank to rank, not through this process (rl/transfer.py)
        assert run.weights == RLRun(config.replace(trainer_tp=1, trainer_ep=1, engine_ep=1)).weights
        assert run.run_step()["bitwise_equal_fraction"] == 1.0
    finally:
        run.close()
