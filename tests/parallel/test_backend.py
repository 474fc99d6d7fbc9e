"""Which backend a side's collectives take (isoexec.parallel.mesh.backend_for): gloo unless
ISOEXEC_DIST_BACKEND=nccl asks for a GPU a rank, which is refused in one line where the device or the machine
cannot give one. NCCL itself needs several GPUs, so it is not run here (the multi-GPU issue's runs do)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from isoexec.parallel import mesh as mesh_module
from isoexec.parallel import spawn


def test_gloo_unless_asked(monkeypatch):
    monkeypatch.delenv("ISOEXEC_DIST_BACKEND", raising=False)
    assert mesh_module.backend_for("cuda", 8) == "gloo"
    assert mesh_module.backend_for(None, 2) == "gloo"
    monkeypatch.setenv("ISOEXEC_DIST_BACKEND", "gloo")
    assert mesh_module.backend_for("cpu", 4) == "gloo"


def test_nccl_with_a_gpu_a_rank(monkeypatch):
    monkeypatch.setenv("ISOEXEC_DIST_BACKEND", "nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert mesh_module.backend_for("cuda", 8) == "nccl"
    assert mesh_module.backend_for(torch.device("cuda"), 4) == "nccl"
    with pytest.raises(ValueError, match=r"needs --device cuda \(got cuda:0\) and 9 GPUs \(this machine has 8\)"):
        mesh_module.backend_for("cuda:0", 9)
    with pytest.raises(ValueError, match="got cpu"):
        mesh_module.backend_for("cpu", 2)


def test_bad_backend_names_are_refused(monkeypatch):
    monkeypatch.setenv("ISOEXEC_DIST_BACKEND", "mpi")
    with pytest.raises(ValueError, match="must be one of gloo, nccl, got 'mpi'"):
        mesh_module.backend_for("cpu", 2)


def test_spawn_refuses_before_starting_a_rank(monkeypatch):
    monkeypatch.setenv("ISOEXEC_DIST_BACKEND", "nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="a GPU of its own"):
        spawn(2, lambda mesh: mesh.rank, device="cuda")


def test_the_audit_says_it_in_one_line():
    env = {**os.environ, "ISOEXEC_DIST_BACKEND": "nccl"}
    done = subprocess.run([sys.executable, "-m", "isoexec", "audit", "--trainer-tp", "2", "--requests", "2", "--max-new-tokens", "2",
                           "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ISOEXEC_DIST_BACKEND=nccl" in lines[0], done.stderr[-2000:]
