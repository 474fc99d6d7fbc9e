"""`isoexec demo` end to end: zero mismatch under the contract, native measured beside it, outputs.

Whether native mismatches on this tiny model depends on the CPU and its libraries, so only that it was
measured is checked; that the gate sees a mismatch is shown with a batch-dependent control in
test_rl_core.py."""

import json
import subprocess
import sys

from conftest import isoexec_here


def test_demo_runs_both_paths_learns_and_writes_its_outputs(tmp_path):
    """The README's main command with its defaults (40 steps per path)."""
    out, summary_path = tmp_path / "demo", tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "isoexec", "demo", "--out", str(out), "--json", str(summary_path), "--quiet"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(summary_path.read_text())
    assert summary["contract"]["steps_with_mismatch"] == 0 and summary["contract"]["tokens_compared"] > 0
    assert summary["native"]["steps_compared"] > 0 and summary["native"]["tokens_compared"] > 0
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [m["path"] for m in log] == ["contract"] * 40 + ["native"] * 40
    assert summary["contract"]["accuracy_gain"] > 0, "the policy did not improve under the contract"
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "contract: 0 of" in result.stdout and "overhead:" in result.stdout


def test_demo_refuses_a_bad_config_before_any_work(capsys):
    """Through the console entry's `main`, in this process (tests/test_errors.py runs such a refusal as a
    user's process)."""
    for args, message in ((["--group-size", "1"], "group_size must be at least 2"), (["--task", "chess"], 'unknown task "chess"'),
                          (["--learning-rate", "0"], "learning_rate must be a positive number"),
                          (["--task", "jsonl", "--data", "/nonexistent.jsonl"], "does not exist")):
        result = isoexec_here(capsys, "demo", *args)
        assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "warm-up" not in result.stdout
