"""gdn.core.triton's kernels compiled for Hopper on a machine without one: the interpreter runs Python the compiler
may refuse, so every forward and backward kernel is built for sm_90a at Qwen3.5-9B's GDN heads and assembled by
ptxas (`benchmarks/gdn_registers.py`, which also reports their registers and spills; a spill is a speed question,
not asserted here)."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import ON_GPU

triton = pytest.importorskip("triton")
ROOT = pathlib.Path(__file__).resolve().parents[3]
PTXAS = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(ON_GPU or not PTXAS.exists(), reason="compiled on a GPU by the GPU tests; needs Triton's ptxas otherwise")
def test_every_kernel_compiles_for_hopper_at_qwen35_heads(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gdn_registers.py")], capture_output=True, text=True, timeout=600,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("gdn_")]
    assert len(rows) == 20, result.stdout  # the forward kernels with the inverse by products and by rows, the backward's
    assert all(0 < int(row[-3]) <= 255 for row in rows), result.stdout
