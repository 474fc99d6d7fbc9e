"""`isoexec demo --out DIR` changes DIR only when a run completes: a run interrupted halfway leaves the
previous complete output as it was, with nothing new beside it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import default_sigint
from isoexec.rl import RLConfig
from isoexec.rl.handshake import ensure_admitted
from isoexec.rl.loop import setup

TINY = dict(warmup_steps=1, prompts_per_step=2, group_size=2)
FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
OLD = {"log.jsonl": '{"old": true}\n', "plot.png": "old plot", "summary.json": '{"old": true}'}


@pytest.fixture(scope="module")
def admitted_home(tmp_path_factory):
    """One ISOEXEC_HOME for the module's subprocesses, so the admission battery runs once."""
    home = tmp_path_factory.mktemp("isoexec_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ISOEXEC_HOME", str(home))
        _, spec, contract = setup(RLConfig(**TINY))
        ensure_admitted(contract, spec=spec)  # at the model's shapes, as the runs look records up
    return home


def old_output(folder):
    folder.mkdir()
    for name, text in OLD.items():
        (folder / name).write_text(text)
    return folder


def contents(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_an_interrupted_demo_leaves_the_previous_output_untouched(tmp_path, admitted_home):
    out = old_output(tmp_path / "demo")
    before = contents(out)
    env = {**os.environ, "ISOEXEC_HOME": str(admitted_home), "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "isoexec", "demo", "--out", str(out), *FLAGS, "--steps=200", "--quiet"],
                                   stdout=stdout, stderr=stderr, env=env, preexec_fn=default_sigint)
    deadline = time.monotonic() + 300
    while " contract " not in (tmp_path / "stdout").read_text():  # the first step's row: the log has a line
        assert process.poll() is None, (tmp_path / "stderr").read_text()
        assert time.monotonic() < deadline, "no step finished in 300 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    assert process.returncode == 130 and (tmp_path / "stderr").read_text() == "isoexec: interrupted\n"
    assert contents(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo", "stderr", "stdout"], "a partial output was left behind"


def test_a_completed_demo_replaces_all_three_files(tmp_path, admitted_home, monkeypatch):
    monkeypatch.setenv("ISOEXEC_HOME", str(admitted_home))
    out = old_output(tmp_path / "demo")
    summary = tmp_path / "summary.json"
    result = subprocess.run([sys.executable, "-m", "isoexec", "demo", "--out", str(out), *FLAGS, "--steps=2", "--quiet",
                             "--json", str(summary)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    new = contents(out)
    assert sorted(new) == sorted(OLD) and all(new[name] != OLD[name].encode() for name in OLD)
    assert [json.loads(line)["path"] for line in new["log.jsonl"].decode().splitlines()] == ["contract"] * 2 + ["native"] * 2
    assert json.loads(summary.read_text()) == json.loads(new["summary.json"])
    assert new["plot.png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo", "summary.json"]
    fresh = tmp_path / "nested" / "fresh"
    assert subprocess.run([sys.executable, "-m", "isoexec", "demo", "--out", str(fresh), *FLAGS, "--steps=1", "--quiet"],
                          capture_output=True, timeout=300).returncode == 0
    assert sorted(p.name for p in fresh.iterdir()) == sorted(OLD) and os.listdir(fresh.parent) == ["fresh"]
