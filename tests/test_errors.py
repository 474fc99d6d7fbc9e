"""Bad input to any command is one line `isoexec: error: …` on stderr and exit 2, never a traceback
(exit 1 means a mismatch or a gate stop); Ctrl-C is one line `isoexec: interrupted` and exit 130."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import default_sigint, isoexec_here, preset_dict
from isoexec.cli import EXIT_INPUT_ERROR, EXIT_INTERRUPTED
from isoexec.contract import Contract, dump_json

pytestmark = pytest.mark.fresh_isoexec_home  # about admission records and the battery's first run

TINY = ["--steps", "1", "--warmup-steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--quiet"]


def user_env(**extra) -> dict:
    """This test's environment (its private ISOEXEC_HOME) without TRITON_INTERPRET, which the suite sets on
    a CPU (conftest.py) and a user's shell does not."""
    return {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, **extra}


def isoexec(*args):
    return subprocess.run([sys.executable, "-m", "isoexec", *args], capture_output=True, text=True, timeout=180, env=user_env())


def unknown_impl_contract(tmp_path) -> str:
    data = preset_dict("tiny-dense")
    for entry in data["composition"]:
        if entry["region"] == "attention":
            entry["impl"]["id"] = "attention.nope"
    path = tmp_path / "nope.json"
    path.write_text(dump_json(Contract.from_dict(data)), "utf-8")
    return str(path)


def not_a_checkpoint_folder(tmp_path) -> str:
    """Only files named like checkpoints that are not: the first fails torch.load with KeyError, the
    second with struct.error."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "step-00000001.pt").write_bytes(b"hello world\n")
    (folder / "step-00000002.pt").write_bytes(b"J}")
    return str(folder)


CASES = {
    "audit-unknown-impl": (["audit", "--contract", "{nope}", "--quiet"], 'impl "attention.nope@1" is not registered'),
    "train-unknown-impl": (["train", "--contract", "{nope}", *TINY], 'impl "attention.nope@1" is not registered'),
    "audit-triton-on-cpu": (["audit", "--contract", "tiny-dense-triton", "--quiet"], "runs Triton kernels"),
    "train-triton-on-cpu": (["train", "--contract", "tiny-dense-triton", *TINY], "runs Triton kernels"),
    "fingerprint-cuda": (["fingerprint", "--device", "cuda"], "--device cuda: no CUDA device is available here"),
    "learning-rate-inf": (["train", "--learning-rate", "inf", *TINY], "learning_rate must be a positive number, got inf, which is not finite"),
    "clip-eps-high-negative": (["train", "--clip-eps-high", "-0.1", *TINY], "clip_eps_high must be a number ≥ 0 when given, got -0.1"),
    "weight-decay-nan": (["demo", "--weight-decay", "nan", *TINY], "weight_decay must be a number ≥ 0, got nan"),
    "data-is-a-directory": (["train", "--task", "jsonl", "--data", "{dir}", *TINY], "is a directory"),
    "checkpoint-dir-is-a-file": (["train", "--checkpoint-dir", "{file}", *TINY], "checkpoint_dir {file} is not a directory"),
    "checkpoints-all-junk": (["train", "--checkpoint-dir", "{junk}", *TINY], "no intact checkpoint in"),
    "demo-out-is-a-file": (["demo", "--out", "{file}", *TINY], "--out {file} is not a directory"),
    "json-in-a-missing-folder": (["train", "--json", "{dir}/missing/last.json", *TINY], "folder {dir}/missing does not exist"),
}


# Cases run as a user's process; the rest call the console entry's `main` in this process (each process
# costs seconds of imports, and `main` is where every one of these errors is caught and printed). The
# Triton cases need a process whose Triton is not the suite's interpreter.
IN_A_PROCESS = ("audit-triton-on-cpu", "train-triton-on-cpu", "demo-out-is-a-file")


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, name):
    if name.endswith(("cuda", "triton-on-cpu")) and torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    args, message = CASES[name]
    (tmp_path / "file").write_text("not a folder")
    places = {"nope": unknown_impl_contract(tmp_path), "dir": str(tmp_path), "file": str(tmp_path / "file"),
              "junk": not_a_checkpoint_folder(tmp_path)}
    args = [a.format(**places) for a in args]
    result = isoexec(*args) if name in IN_A_PROCESS else isoexec_here(capsys, *args)
    assert result.returncode == EXIT_INPUT_ERROR, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("isoexec: error: "), result.stderr
    assert message.format(**places) in lines[0]
    assert "warm-up" not in result.stdout


@pytest.mark.parametrize("variable,value,message", [
    ("ISOEXEC_ATTENTION_BLOCKS_MIN", "many", "ISOEXEC_ATTENTION_BLOCKS_MIN must be a positive number of key blocks or 'off', got 'many'"),
    ("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", "0", "ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN must be a whole number >= 1 or 'off', got '0'"),
    ("ISOEXEC_ATTENTION_GLUON", "yes", "ISOEXEC_ATTENTION_GLUON must be 0 or 1, got 'yes'"),
    ("ISOEXEC_ATTENTION_SPANS", "off", "ISOEXEC_ATTENTION_SPANS must be 0 or 1, got 'off'"),
])
def test_a_bad_environment_knob_is_one_line_and_exit_2(variable, value, message):
    """The kernels' ISOEXEC_* knobs are read when their modules import (`isoexec.env.EnvError`)."""
    result = subprocess.run([sys.executable, "-m", "isoexec", "audit", "--requests", "1", "--max-new-tokens", "2", "--quiet"],
                            capture_output=True, text=True, timeout=180, env=user_env(**{variable: value}))
    assert result.returncode == EXIT_INPUT_ERROR, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [f"isoexec: error: {message}"]


def interrupt(tmp_path, args, marker: str, stream: str = "stdout", wait_s: float = 120):
    """Run `isoexec args`, send SIGINT once `marker` appears on `stream` (or after `wait_s`); -> (rc, stdout, stderr)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = user_env(PYTHONUNBUFFERED="1")
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "isoexec", *args], stdout=stdout, stderr=stderr, env=env,
                                   preexec_fn=default_sigint)
    deadline = time.monotonic() + wait_s
    watched = out if stream == "stdout" else err
    while marker not in watched.read_text() and time.monotonic() < deadline:
        assert process.poll() is None, f"exited ({process.returncode}) before printing {marker!r}: {err.read_text()}"
        time.sleep(0.05)
    before = err.read_text()
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    return process.returncode, out.read_text(), before, err.read_text()[len(before):]


def test_ctrl_c_during_validate_is_one_line_and_exit_130(tmp_path):
    rc, stdout, before, after = interrupt(tmp_path, ["validate", "--no-record"], "validating")
    assert stdout.startswith("validating")
    assert rc == EXIT_INTERRUPTED and after == "isoexec: interrupted\n", before + after


def test_ctrl_c_during_train_is_one_line_and_exit_130_and_the_warm_up_is_announced(tmp_path):
    """A fresh ISOEXEC_HOME: the admission battery runs first, for long enough to be interrupted."""
    rc, _, before, after = interrupt(tmp_path, ["train", *TINY[:-1]], "warm-up:", stream="stderr", wait_s=20)
    assert before.startswith("warm-up: 1 supervised steps on task addition"), before
    # The battery's progress line may come out before the signal lands; the interrupt itself is one line.
    lines = after.splitlines()
    assert rc == EXIT_INTERRUPTED and lines[-1] == "isoexec: interrupted", before + after
    assert all(line.startswith("admission: ") for line in lines[:-1]), before + after
