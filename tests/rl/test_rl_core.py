"""RL building blocks: losses, tasks, config validation, the gate and the weight sync."""

import copy

import pytest
import torch

from controls import control_contract
from isoexec.contract import Contract, dump_json
from isoexec.rl import GateError, RLConfig, RLRun
from isoexec.rl import losses
from isoexec.rl.sync import WeightSyncError, load_state, state_bytes, sync_in_process, weights_digest
from isoexec.rl.tasks import addition, jsonl, load_task

SMALL = dict(steps=2, prompts_per_step=4, group_size=4, warmup_steps=5)


def test_group_advantages_and_dynamic_sampling():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = losses.group_advantages(rewards, 4)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, 1.0, -1.0]), atol=1e-5) and adv[4:].abs().max() == 0
    assert losses.informative_groups(rewards, 4).tolist() == [True] * 4 + [False] * 4


def test_overlong_penalty_ramps_then_caps():
    lengths, truncated = torch.tensor([2, 4, 5, 6, 6]), torch.tensor([False, False, False, False, True])
    assert losses.overlong_penalty(lengths, truncated, 6, 2, 1.0).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]


def test_policy_loss_clips_and_aggregates():
    logp_old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.0, 0.5, 1.0]))
    adv, seq_index = torch.tensor([1.0, -1.0]), torch.tensor([0, 0, 1, 1])
    token, stats = losses.policy_loss(logp, logp_old, adv, seq_index, eps_low=0.2, eps_high=0.28, aggregation="token")
    # token 0: min(1.5, 1.28) = 1.28; token 1: 1; token 2 (A<0): min(-0.5, -0.8) = -0.8; token 3: -1
    assert token.item() == pytest.approx(-(1.28 + 1.0 - 0.8 - 1.0) / 4)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    sequence, _ = losses.policy_loss(logp, logp_old, adv, torch.tensor([0, 0, 0, 1]), eps_low=0.2, eps_high=0.28, aggregation="sequence")
    assert sequence.item() == pytest.approx(-((1.28 + 1.0 + 0.5) / 3 + (-1.0)) / 2)


def test_tasks_tokenize_and_reward():
    task = addition()
    ex = task.sample(__import__("random").Random(0), 3)
    assert all(e.prompt.endswith("=") and str(eval(e.prompt[:-1])) == e.answer for e in ex)
    tok = task.tokenizer
    ids = tok.encode(ex[0].answer) + [tok.EOS, 5]
    assert tok.decode(ids) == ex[0].answer and task.reward(ex[0], ex[0].answer) == 1.0 and task.reward(ex[0], "x") == 0.0
    with pytest.raises(ValueError, match="not in the task's alphabet"):
        tok.encode("a")


def test_jsonl_task_loads_and_refuses_bad_files(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "ab=", "answer": "ba"}\n\n{"prompt": "xy=", "answer": "yx"}\n')
    task = jsonl(path)
    assert {e.answer for e in task.sample(__import__("random").Random(0), 20)} == {"ba", "yx"}
    path.write_text('{"prompt": "ab="}\n')
    with pytest.raises(ValueError, match=r'data.jsonl:1: expected a JSON object with "prompt" and "answer"'):
        jsonl(path)
    with pytest.raises(ValueError, match="does not exist"):
        load_task("jsonl", str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize("changes,message", [
    ({"task": "chess"}, 'unknown task "chess"'),
    ({"group_size": 1}, "group_size must be at least 2"),
    ({"learning_rate": 0.0}, "learning_rate must be a positive number"),
    ({"learning_rate": -1e-3}, "learning_rate must be a positive number"),
    ({"task": "jsonl"}, 'task "jsonl" needs a data file'),
    ({"task": "jsonl", "data": "/nonexistent.jsonl"}, "data file /nonexistent.jsonl does not exist"),
    ({"algorithm": "ppo"}, "algorithm must be one of grpo, dapo"),
    ({"temperature": 0.0}, "temperature must be > 0"),
    ({"steps": 0}, "steps must be a positive int"),
])
def test_bad_configs_are_refused_before_any_work(changes, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**changes)


def test_weight_sync_digests_match_and_corruption_is_refused():
    run = RLRun(RLConfig(**SMALL))
    assert run.weights == weights_digest(run.learner.policy) == weights_digest(run.rollout.model)
    tensors, digest = run.learner.weights()
    tensors["lm_head.weight"] = tensors["lm_head.weight"].clone()
    tensors["model.norm.weight"][0] += 1.0
    with pytest.raises(WeightSyncError, match="arrived corrupted"):
        load_state(run.rollout.model, tensors, digest)
    clone = copy.deepcopy(run.learner.policy)
    assert sync_in_process(run.learner.policy, clone) == digest
    assert state_bytes(clone).keys() == run.learner.policy.state_dict().keys()


def test_gate_passes_under_the_contract_and_measures_a_batch_dependent_control(tmp_path):
    """GRPO keeps every group, so every step is gated. The control's linear is batch-dependent by
    construction (`controls.py`): rollout decode batches of 16 rows and the trainer's packed batch take
    different reduction orders, and a contract claiming nothing has its mismatch measured, not stopped.
    (Native is no control: whether it mismatches on this tiny model depends on the CPU and the library.)"""
    config = {**SMALL, "algorithm": "grpo"}
    metrics = RLRun(RLConfig(**config)).run_step()
    assert metrics["tokens"] > 0
    assert metrics["bitwise_equal_fraction"] == 1.0 and metrics["rollout_train_logprob_abs_diff_max"] == 0.0
    path = tmp_path / "control.json"
    path.write_text(dump_json(control_contract("linear")), "utf-8")
    measured = RLRun(RLConfig(**config, contract=str(path))).run_step()
    assert measured["tokens"] > 0 and measured["bitwise_equal_fraction"] < 1.0 and measured["rollout_train_logprob_abs_diff_max"] > 0


def test_gate_stops_a_step_whose_trainer_logprobs_differ():
    run = RLRun(RLConfig(**SMALL, trace=True))
    real_generate = run.rollout.generate

    def tampered(prompts, params):
        completions = real_generate(prompts, params)
        victim = next(c for c in completions if c.token_ids)
        victim.logprobs[0] = torch.nextafter(victim.logprobs[0], torch.tensor(0.0))  # one ulp
        return completions

    run.rollout.generate = tampered
    with pytest.raises(GateError) as caught:
        for _ in range(3):
            run.run_step()
    report = caught.value.report
    assert report["request"] >= 0 and report["position"] >= 0 and report["bitwise_equal_fraction"] < 1
    assert "gate: step" in str(caught.value) and "trace" in report


def test_rl_on_the_moe_preset_has_zero_mismatch_on_every_step(tmp_path):
    """`model="tiny-moe"`: the Qwen3-MoE preset's shape over the task's characters, under its family's
    contract (tiny-moe, the default); every gated step bitwise, and its MoE expert control measured."""
    from controls import control_moe_experts
    from conftest import preset_dict

    config = RLConfig(**{**SMALL, "algorithm": "grpo", "steps": 3}, model="tiny-moe")
    run = RLRun(config)
    assert run.contract.name == "tiny-moe" and run.learner.policy.spec.family == "qwen3-moe"
    assert type(run.learner.policy.model.layers[1].mlp).__name__ == "MoE"
    for _ in range(config.steps):
        metrics = run.run_step()
        assert metrics["tokens"] > 0 and metrics["bitwise_equal_fraction"] == 1.0 and metrics["rollout_train_logprob_abs_diff_max"] == 0.0
    path = tmp_path / "control.json"
    path.write_text(dump_json(Contract.from_dict(control_moe_experts(preset_dict("tiny-moe"), small_rows=8))), "utf-8")
    measured = RLRun(config.replace(contract=str(path), steps=1)).run_step()
    assert measured["bitwise_equal_fraction"] < 1.0
