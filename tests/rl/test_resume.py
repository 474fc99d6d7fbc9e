"""Checkpoint/resume: a run killed with SIGKILL mid-run and started again ends bitwise identical to one
never interrupted (weights, AdamW state, RNG states, metrics), in real subprocesses."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import bitwise_equal, int_view
from isoexec.cli import _Parser
from isoexec.contract import ContractError
from isoexec.rl import RLConfig
from isoexec.rl.checkpoint import CheckpointError, checkpoints, content_digest, latest, load, restore, save
from isoexec.rl.handshake import ensure_admitted
from isoexec.rl.loop import setup
from isoexec.rl.train import add_parser, train

SMALL = dict(steps=8, prompts_per_step=4, group_size=4, warmup_steps=5, checkpoint_every=1, seed=3)
NUM_THREADS = 1  # CPU matmul bits in the backward pass may depend on it: the same in every process
KILL_AFTER_STEP = 2
SCRIPT = """
import sys, torch
torch.set_num_threads({threads})
from isoexec.rl import RLConfig
from isoexec.rl.train import train
train(RLConfig(**{config!r}), progress=True, log_jsonl=sys.argv[1])
"""


def without_timings(history):
    return [{k: v.hex() if isinstance(v, float) else v for k, v in m.items() if not k.endswith("_seconds")} for m in history]


@pytest.fixture(scope="module")
def admitted_home(tmp_path_factory):
    """One ISOEXEC_HOME for the module and its subprocesses, so the admission battery runs once."""
    home = tmp_path_factory.mktemp("isoexec_home")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ISOEXEC_HOME", str(home))
        torch.set_num_threads(NUM_THREADS)
        try:
            _, spec, contract = setup(RLConfig(**SMALL))
            ensure_admitted(contract, spec=spec)  # at the model's shapes, as the runs look records up
        finally:
            torch.set_num_threads(threads)
    return home


@pytest.fixture(autouse=True)
def _shared_home_one_thread(_isoexec_home, admitted_home, monkeypatch):
    monkeypatch.setenv("ISOEXEC_HOME", str(admitted_home))
    threads = torch.get_num_threads()
    torch.set_num_threads(NUM_THREADS)
    yield
    torch.set_num_threads(threads)


def _start(root, name, attempt, env):
    config = {**SMALL, "checkpoint_dir": str(root / name)}
    with open(root / f"{name}-{attempt}.stderr", "w") as stderr:
        return subprocess.Popen([sys.executable, "-c", SCRIPT.format(threads=NUM_THREADS, config=config), str(root / f"{name}.jsonl")],
                                env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def _finish(process, stderr_path) -> str:
    process.wait(timeout=300)
    stderr = stderr_path.read_text()
    assert process.returncode == 0, stderr
    return stderr


def _kill_after(process, directory, step, stderr_path) -> int:
    """SIGKILL `process` as soon as a checkpoint for `step` or later exists; the step it had reached."""
    deadline = time.monotonic() + 300
    while not (found := checkpoints(directory)) or max(found) < step:
        if process.poll() is not None:
            pytest.fail(f"the run exited ({process.returncode}) before its step-{step} checkpoint: {stderr_path.read_text()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no step-{step} checkpoint in {directory} after 300 s")
        time.sleep(0.002)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    return max(checkpoints(directory))


@pytest.fixture(scope="module")
def runs(admitted_home, tmp_path_factory):
    """One run straight through, and one killed after its step-2 checkpoint and started again, side by side."""
    root = tmp_path_factory.mktemp("runs")
    env = {**os.environ, "ISOEXEC_HOME": str(admitted_home), "OMP_NUM_THREADS": str(NUM_THREADS), "MKL_NUM_THREADS": str(NUM_THREADS)}
    straight = _start(root, "straight", 0, env)
    interrupted = _start(root, "interrupted", 0, env)
    killed_at = _kill_after(interrupted, root / "interrupted", KILL_AFTER_STEP, root / "interrupted-0.stderr")
    survivors = [load(path) for path in checkpoints(root / "interrupted").values()]  # none torn
    resumed = _start(root, "interrupted", 1, env)
    _finish(straight, root / "straight-0.stderr")
    resumed_stderr = _finish(resumed, root / "interrupted-1.stderr")
    return SimpleNamespace(root=root, straight=root / "straight", resumed=root / "interrupted", killed_at=killed_at,
                           survivors=survivors, resumed_stderr=resumed_stderr)


def test_killed_run_resumes_bitwise_identical(runs):
    assert KILL_AFTER_STEP <= runs.killed_at < SMALL["steps"], "the kill must land mid-run"
    assert [p["step"] for p in runs.survivors][-1] == runs.killed_at
    assert f"resuming from {runs.resumed} at step {runs.killed_at} of {SMALL['steps']}" in runs.resumed_stderr
    a, b = load(latest(runs.straight)), load(latest(runs.resumed))
    assert a["step"] == b["step"] == SMALL["steps"]
    assert a["weights_sha256"] == b["weights_sha256"]
    assert a["policy"].keys() == b["policy"].keys() and all(bitwise_equal(a["policy"][k], b["policy"][k]) for k in a["policy"])
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert state_a.keys() == state_b.keys() and len(state_a) == len(a["optimizer"]["param_groups"][0]["params"])
    for index in state_a:
        assert state_a[index].keys() == state_b[index].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(bitwise_equal(state_a[index][k], state_b[index][k]) for k in state_a[index]), index
    assert float(state_a[0]["step"]) > 0
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"]) and a["rng"]["python"] == b["rng"]["python"]
    assert len(a["history"]) == SMALL["steps"] and without_timings(a["history"]) == without_timings(b["history"])
    logged = [json.loads(line) for line in (runs.root / "interrupted.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == list(range(SMALL["steps"]))
    assert without_timings(logged) == without_timings(b["history"])


def test_resume_under_a_changed_config_is_refused(runs):
    config = RLConfig(**SMALL, checkpoint_dir=str(runs.straight))
    with pytest.raises(CheckpointError, match=r"different config \(group_size: checkpoint 4, now 8; learning_rate: checkpoint 0.0005, now 0.001\)"):
        restore(config.replace(learning_rate=1e-3, group_size=8), runs.straight)
    with pytest.raises(CheckpointError, match=r"different config \(seed: checkpoint 3, now 4\)"):
        train(config.replace(seed=4), progress=False)


def test_corrupt_checkpoints_are_refused(runs, tmp_path):
    config = RLConfig(**SMALL)
    source = latest(runs.straight)
    payload = torch.load(source, weights_only=True)
    name = next(iter(payload["policy"]))
    int_view(payload["policy"][name]).view(-1)[0] ^= 1  # one flipped bit in one weight

    flipped = tmp_path / "flipped"
    flipped.mkdir()
    torch.save(payload, flipped / source.name)
    with pytest.raises(CheckpointError, match=r"is corrupt: its contents hash to sha256:\w+, but it was written as"):
        restore(config, flipped)

    rehashed = tmp_path / "rehashed"  # a digest recomputed over the damage still misses the weights digest
    rehashed.mkdir()
    payload["content_sha256"] = content_digest(payload)
    torch.save(payload, rehashed / source.name)
    with pytest.raises(CheckpointError, match=r"is corrupt: the policy loaded from it has digest"):
        restore(config, rehashed)

    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / source.name).write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"is unreadable \(torn or corrupt\)"):
        restore(config, torn)


def test_a_checkpoint_from_before_master_weights_still_resumes(runs, tmp_path):
    """Files written before checkpoints held a bfloat16 policy's masters lack the field; their float32 policy has none."""
    source = latest(runs.straight)
    payload = torch.load(source, weights_only=True)
    assert payload.pop("masters") == {}
    payload["content_sha256"] = content_digest(payload)
    older = tmp_path / "older"
    older.mkdir()
    torch.save(payload, older / source.name)
    assert restore(RLConfig(**SMALL), older).weights == payload["weights_sha256"]


def test_a_write_cut_short_leaves_the_previous_checkpoint(runs, tmp_path, monkeypatch):
    directory = tmp_path / "run"
    shutil.copytree(runs.straight, directory)
    run = restore(RLConfig(**SMALL), directory)
    run.run_step()
    before = {step: path.read_bytes() for step, path in checkpoints(directory).items()}

    def dies_halfway(payload, out):
        out.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr("isoexec.rl.checkpoint.torch.save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save(run, directory)
    assert sorted(p.name for p in directory.iterdir()) == sorted(p.name for p in runs.straight.iterdir())
    assert {step: path.read_bytes() for step, path in checkpoints(directory).items()} == before
    assert load(latest(directory))["step"] == SMALL["steps"]
    (directory / ".step-00000099.pt.abc.tmp").write_bytes(b"left by a killed writer")
    assert latest(directory).name == f"step-{SMALL['steps']:08d}.pt"


def _train_args(*flags):
    parser = _Parser(prog="isoexec")
    add_parser(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    return parser.parse_args(["train", *flags])


FLAGS = [f"--{name.replace('_', '-')}={value}" for name, value in SMALL.items() if name != "steps"]


def test_train_command_extends_a_run_and_reports_bad_input(runs, tmp_path, capsys):
    directory = tmp_path / "run"
    shutil.copytree(runs.straight, directory)
    flags = FLAGS
    out, log = tmp_path / "final.json", tmp_path / "log.jsonl"
    args = _train_args(*flags, f"--steps={SMALL['steps'] + 1}", f"--checkpoint-dir={directory}", f"--json={out}", f"--log={log}", "--quiet")
    assert args.run(args) == 0
    assert max(checkpoints(directory)) == SMALL["steps"] + 1
    assert json.loads(out.read_text())["step"] == SMALL["steps"]
    final = capsys.readouterr().out.strip().splitlines()[-1]
    assert final.startswith(f"trained {SMALL['steps'] + 1} steps (numbered from 0); step {SMALL['steps']}: reward "), final
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert without_timings(logged[:-1]) == without_timings(load(latest(runs.straight))["history"])

    args = _train_args("--group-size=1")
    with pytest.raises(ContractError, match=r"^group_size must be at least 2"):
        args.run(args)
    args = _train_args(*flags, "--learning-rate=0.001", f"--checkpoint-dir={directory}", "--quiet")
    with pytest.raises(ContractError, match=r"learning_rate: checkpoint 0.0005, now 0.001"):
        args.run(args)


def _torch_file(payload) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _damage(kind: str, source) -> bytes:
    """A file in place of a good checkpoint: torn, not a checkpoint at all, another format, altered."""
    if kind == "torn":
        return source.read_bytes()[: source.stat().st_size // 2]
    if kind == "text":
        return b"hello world\n"  # torch.load: KeyError
    if kind == "two-bytes":
        return b"J}"  # torch.load: struct.error
    payload = torch.load(source, weights_only=True)
    if kind == "other-format":
        return _torch_file({**payload, "format": "isoexec-rl-checkpoint/9"})
    if kind == "missing-field":
        del payload["optimizer"]
        return _torch_file({**payload, "content_sha256": content_digest(payload)})
    assert kind == "rehashed"
    int_view(next(iter(payload["policy"].values()))).view(-1)[0] ^= 1
    return _torch_file({**payload, "content_sha256": content_digest(payload)})


STRAYS = ("notes.txt", "step-00000009.pt.bak", "step-9.txt", ".step-00000010.pt.abc.tmp")


@pytest.mark.parametrize("kind", ["torn", "text", "two-bytes", "other-format", "missing-field", "rehashed"])
def test_resume_falls_back_past_a_damaged_newest_checkpoint(runs, tmp_path, kind):
    """The newest file is skipped with one line naming it and why; files not named like checkpoints are
    not looked at; the run goes on from the older one, bit for bit."""
    directory = tmp_path / "run"
    shutil.copytree(runs.straight, directory)
    newest = latest(directory)
    newest.write_bytes(_damage(kind, newest))
    for name in STRAYS:
        (directory / name).write_text("not a checkpoint")
    (directory / "step-00000011.pt").mkdir()
    warnings = []
    run = restore(RLConfig(**SMALL), directory, warn=warnings.append)
    assert run.step == SMALL["steps"] - 1
    [warning] = warnings
    assert warning.startswith(f"checkpoint {newest} ") and warning.endswith(f"; skipped it for step-{SMALL['steps'] - 1:08d}.pt")
    run.run_step()
    assert run.weights == load(latest(runs.straight))["weights_sha256"]


def test_no_intact_checkpoint_left_is_an_error_naming_each(runs, tmp_path):
    directory = tmp_path / "run"
    shutil.copytree(runs.straight, directory)
    older, newest = checkpoints(directory).values()
    older.write_bytes(b"J}")
    newest.write_bytes(_damage("other-format", newest))
    with pytest.raises(CheckpointError, match=rf"^no intact checkpoint in {directory}: checkpoint {newest} has format "
                                              rf"'isoexec-rl-checkpoint/9'.*; checkpoint {older} is unreadable \(torn or corrupt\): struct.error"):
        restore(RLConfig(**SMALL), directory)


def test_train_command_resumes_past_a_torn_checkpoint_with_one_warning(runs, tmp_path, capsys):
    directory = tmp_path / "run"
    shutil.copytree(runs.straight, directory)
    newest = latest(directory)
    newest.write_bytes(_damage("torn", newest))
    args = _train_args(*FLAGS, f"--steps={SMALL['steps']}", f"--checkpoint-dir={directory}", "--quiet")
    assert args.run(args) == 0
    [warning] = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith(f"isoexec: warning: checkpoint {newest} is unreadable (torn or corrupt): ")
    assert load(latest(directory))["weights_sha256"] == load(latest(runs.straight))["weights_sha256"]
