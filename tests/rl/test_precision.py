"""The RL loop's bfloat16 policy with float32 master weights, its device option, and the folded weight digest
a GPU run syncs with (rl/sync.py). On this CPU the bfloat16 run computes slowly but by the same code a GPU runs."""

import pytest
import torch

from controls import control_contract
from isoexec.contract import dump_json
from isoexec.rl import RLConfig, RLRun
from isoexec.rl.sync import fold, state_digest, weights_digest
from isoexec.rl.train import train

SMALL = dict(steps=2, prompts_per_step=4, group_size=4, warmup_steps=5, algorithm="grpo")


@pytest.mark.parametrize("changes,message", [
    ({"device": "tpu"}, "device must be one of cpu, cuda"),
    ({"dtype": "float16"}, "dtype must be one of float32, bfloat16"),
    ({"model_vocab": True}, "model_vocab applies to a model preset"),
    ({"device": "cuda", "trainer_dp": 2}, "trainer_dp on the GPU runs over NCCL"),
])
def test_bad_device_and_dtype_configs_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**changes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_is_refused_in_one_line_without_a_gpu():
    with pytest.raises(ValueError, match="device cuda: this machine has no CUDA device"):
        RLConfig(device="cuda")


def test_policy_dtype_defaults_by_device():
    assert RLConfig().policy_dtype == "float32" and not RLConfig().master_weights
    assert RLConfig(dtype="bfloat16").master_weights


def test_fold_is_exact_and_sees_what_a_transfer_can_do():
    t = torch.randn(3 * (1 << 20) + 7, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    words = t.view(torch.int16).to(torch.int64)
    folded = fold(t)
    assert folded.shape == (2, 4) and folded.dtype == torch.int64
    assert folded[0, 1].item() == sum(int(w) * (2 * j + 1) for j, w in enumerate(words[1 << 20 : (1 << 20) + 4096].tolist())) + int(
        (words[(1 << 20) + 4096 : 2 << 20] * (2 * torch.arange(4096, 1 << 20) + 1)).sum())
    changed = {"one ulp": t.view(torch.int16).clone(), "two words swapped": t.clone(), "a zeroed tail": t.clone(), "a shift": t.roll(1)}
    changed["one ulp"][12345] += 1
    changed["two words swapped"][[10, 20]] = t[[20, 10]]
    changed["a zeroed tail"][-1000:] = 0
    for what, other in changed.items():
        other = other.view(torch.bfloat16)
        assert not torch.equal(fold(other), folded), what
        assert state_digest({"w": other}, folded=True) != state_digest({"w": t}, folded=True), what
    assert state_digest({"w": t}, folded=True).startswith("fold-sha256:") and state_digest({"w": t}).startswith("sha256:")


def test_a_bfloat16_policy_steps_float32_masters_and_stays_bitwise(tmp_path):
    """Every parameter is the bfloat16 rounding of its master after a step, the masters moved by less than a
    bfloat16 ulp somewhere (so stepping the bfloat16 weights directly would have lost that update), the engine
    holds the trainer's weights, and every gated token is bitwise under the contract; a control contract whose
    linear is batch-dependent by construction shows the gate can see a mismatch in bfloat16 too."""
    run = RLRun(RLConfig(**SMALL, dtype="bfloat16"))
    policy = run.learner.policy
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    for _ in range(2):
        metrics = run.run_step()
        assert metrics["tokens"] > 0 and metrics["bitwise_equal_fraction"] == 1.0
        assert {"generate_seconds", "train_seconds", "sync_seconds"} <= metrics.keys()
    masters = dict(run.learner.master.named_parameters())
    assert {m.dtype for m in masters.values()} == {torch.float32}
    for name, p in policy.named_parameters():
        assert torch.equal(p.detach().view(torch.int16), masters[name].detach().to(torch.bfloat16).view(torch.int16)), name
    moved = [name for name, p in policy.named_parameters() if not torch.equal(masters[name].detach(), before[name].float())]
    assert moved, "the masters did not move"
    hidden = sum(int(((masters[n].detach() != before[n].float()) & (policy.get_parameter(n).detach() == before[n])).sum()) for n in moved)
    assert hidden > 0, "every master update was at least half an ulp: the test cannot tell masters from bfloat16 steps"
    assert run.weights == weights_digest(policy) == weights_digest(run.rollout.model)

    path = tmp_path / "control.json"
    path.write_text(dump_json(control_contract("linear")), "utf-8")
    measured = RLRun(RLConfig(**SMALL, dtype="bfloat16", contract=str(path))).run_step()
    assert measured["tokens"] > 0 and measured["bitwise_equal_fraction"] < 1.0


def _control_file(tmp_path):
    path = tmp_path / "control.json"
    path.write_text(dump_json(control_contract("linear")), "utf-8")
    return path


def test_a_preset_keeps_its_vocabulary_and_the_gate_can_skip_full_rows(tmp_path):
    """model_vocab: the preset's 512 ids, not the task's 13, so the random policy rarely samples end-of-sequence;
    gate_full_rows off: the engine returns no rows, the gate holds the sampled tokens' log-probs only, and still
    sees the split-K linear control differ."""
    from isoexec.model import PRESETS

    config = RLConfig(**{**SMALL, "warmup_steps": 0, "max_new_tokens": 12}, model="tiny-dense", model_vocab=True, gate_full_rows=False)
    run = RLRun(config)
    assert run.learner.policy.spec.vocab_size == PRESETS["tiny-dense"].vocab_size > run.task.tokenizer.vocab_size
    _, prompts, params = run.requests()
    assert not any(p.return_full_logprobs for p in params)
    metrics = run.run_step()
    assert metrics["tokens"] > 0 and metrics["bitwise_equal_fraction"] == 1.0
    assert "full_vocab_rows_bitwise_equal_fraction" not in metrics
    assert metrics["tokens"] > len(prompts) * 6  # most completions run well past the toy's usual few tokens
    control = RLConfig(**{**SMALL, "warmup_steps": 0, "max_new_tokens": 12}, model="tiny-dense", model_vocab=True, gate_full_rows=False,
                       contract=str(_control_file(tmp_path)))
    assert RLRun(control).run_step()["bitwise_equal_fraction"] < 1.0


def _bits(named) -> dict:
    return {name: t.detach().float().view(torch.int32) for name, t in named}


def _timeless(history) -> list:
    return [{k: v for k, v in m.items() if not k.endswith("_seconds")} for m in history]


def test_the_warm_ups_gradients_do_not_reach_the_first_step():
    """With masters the optimiser clears the masters' gradients, not the policy's, and the warm-up leaves gradients
    on the policy: each step must drop them before its backward. Zero advantages give a zero loss and so a zero
    gradient, whatever the warm-up left."""
    run = RLRun(RLConfig(**SMALL, dtype="bfloat16"))
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in run.learner.policy.parameters())  # what the warm-up left
    _, prompts, params = run.requests()
    kept = run.rollout.generate(prompts, params)
    metrics = run.learner.update(kept, torch.zeros(len(kept)), step=0)
    assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_bfloat16_run_resumes_from_its_checkpoint_bit_for_bit(device, tmp_path):
    """A bfloat16 policy's checkpoint holds its float32 masters and their AdamW state: a run stopped after step 1
    and resumed ends step 2 with the masters, the policy and the metrics of a run never stopped. The masters hold
    more than the policy does (some differ from their own rounding widened back), so a resume that rebuilt them
    from the policy would not continue the same run."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    config = RLConfig(**SMALL, dtype="bfloat16", checkpoint_every=1, device=device, contract="tiny-dense-triton" if device == "cuda" else None)
    whole = train(config.replace(checkpoint_dir=str(tmp_path / "whole")), progress=False)
    train(config.replace(steps=1, checkpoint_dir=str(tmp_path / "stopped")), progress=False)
    resumed = train(config.replace(checkpoint_dir=str(tmp_path / "stopped")), progress=False)
    assert len(whole.history) == 2 and _timeless(resumed.history) == _timeless(whole.history)
    for side in ("master", "policy"):
        ours, theirs = (_bits(getattr(run.learner, side).named_parameters()) for run in (whole, resumed))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in ours)
    widened = {name: p.detach().float() for name, p in resumed.learner.policy.named_parameters()}
    assert any(not torch.equal(m.detach(), widened[name]) for name, m in resumed.learner.master.named_parameters())


@pytest.mark.gpu
@pytest.mark.parametrize("model,contract", [(None, "tiny-dense-triton"), ("tiny-hybrid-moe", "tiny-hybrid-triton")])
def test_rl_on_a_gpu_is_bitwise_and_its_control_is_not(model, contract, tmp_path):
    """The loop on one GPU: a bfloat16 policy under the Triton contract, the weights synced device to device with
    the folded digest, every gated token and row bitwise. The control: the toy under the reference contract with
    the split-K linear (`controls.py`, reference ops on the GPU), measured differing."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    config = RLConfig(**SMALL, device="cuda", model=model, contract=contract)
    run = RLRun(config)
    assert next(run.learner.policy.parameters()).is_cuda and next(run.rollout.model.parameters()).is_cuda
    for _ in range(config.steps):
        metrics = run.run_step()
        assert metrics["tokens"] > 0 and metrics["bitwise_equal_fraction"] == 1.0
        assert metrics["full_vocab_rows_bitwise_equal_fraction"] == 1.0
    assert run.weights.startswith("fold-sha256:")
    assert run.weights == weights_digest(run.learner.policy, folded=True) == weights_digest(run.rollout.model, folded=True)
    if model is None:
        path = tmp_path / "control.json"
        path.write_text(dump_json(control_contract("linear")), "utf-8")
        measured = RLRun(config.replace(contract=str(path))).run_step()
        assert measured["tokens"] > 0 and measured["bitwise_equal_fraction"] < 1.0
