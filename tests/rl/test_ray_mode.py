import os
import pickle
import sys

import pytest
import torch

from isoexec.rl import RLConfig, RLRun
from isoexec.rl.gate import GateError
from isoexec.rl.ray_mode import run_with_ray
from isoexec.rl.sync import WeightSyncError

CONFIG = RLConfig(steps=3, prompts_per_step=4, group_size=4, warmup_steps=5)
NUM_THREADS = 1


def without_timings(history):
    return [{k: v for k, v in step.items() if not k.endswith("_seconds")} for step in history]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same config run with Ray actors and in this process, both on NUM_THREADS threads."""
    ray = pytest.importorskip("ray")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        # One admission home for both runs (and the actors, which inherit it) keeps the battery to one pass.
        patch.setenv("ISOEXEC_HOME", str(tmp_path_factory.mktemp("isoexec_home")))
        torch.set_num_threads(NUM_THREADS)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            in_ray = run_with_ray(CONFIG, num_threads=NUM_THREADS)
            local = RLRun(CONFIG)
            for _ in range(CONFIG.steps):
                local.run_step()
            yield in_ray, local
        finally:
            ray.shutdown()
            torch.set_num_threads(threads)


def test_ray_run_is_bitwise_the_in_process_run(runs):
    in_ray, local = runs
    assert in_ray.verdict.ok
    assert len(in_ray.history) == CONFIG.steps
    assert without_timings(in_ray.history) == without_timings(local.history)
    assert in_ray.weights == local.weights == local.learner.weights()[1]


def test_sides_run_in_their_own_processes_on_the_pinned_thread_count(runs):
    in_ray, _ = runs
    pids = {in_ray.learner.pid(), in_ray.rollout.pid()}
    assert len(pids) == 2 and os.getpid() not in pids
    assert in_ray.learner.num_threads() == in_ray.rollout.num_threads() == NUM_THREADS


def test_corrupted_weight_transfer_is_refused(runs):
    ray = pytest.importorskip("ray")
    in_ray, _ = runs
    tensors, digest = in_ray.learner.weights()
    assert isinstance(tensors, ray.ObjectRef)
    state = dict(ray.get(tensors))
    name = sorted(state)[0]
    flipped = state[name].clone()
    flipped.view(-1)[:1].view(torch.int32).bitwise_xor_(1)  # one low mantissa bit
    with pytest.raises(WeightSyncError, match="arrived corrupted"):
        in_ray.rollout.load_weights(state | {name: flipped}, digest)
    assert in_ray.sync() == in_ray.weights  # an intact resend is accepted again


def test_gate_error_keeps_its_report_across_processes():
    report = {"summary": "gate: step 0: 1 of 4 trainer log-probs differ", "request": 3, "position": 7}
    error = pickle.loads(pickle.dumps(GateError(report)))
    assert isinstance(error, GateError) and error.report == report


def test_missing_ray_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match="pip install ray"):
        run_with_ray(CONFIG)
