"""The two instructions the attention kernels write out themselves (`triton_support.rounded_mul`, `exp_ftz`), compiled
for sm_90a on any machine: a product followed by a subtraction stays a `mul.rn.f32` where Triton's floating-point
fusion makes one `fma` of the plain product (the control); the exp is one `ex2.approx.ftz.f32` where `tl.exp` adds the
non-flushing `ex2.approx.f32` (the control). On a GPU the attention tests check the bits these give (decode rows equal
prefill rows over whole blocks with and without masks)."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from conftest import require_triton

require_triton()

from isoexec.ops import triton_support  # noqa: E402

PTXAS = pathlib.Path(triton_support.triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"

KERNELS = '''
import triton.language as tl
from isoexec.ops.triton_support import exp_ftz, jit, rounded_mul


@jit
def written(x, y, scale, m, WRITTEN: tl.constexpr):
    o = tl.arange(0, 128)
    a = tl.load(x + o)
    if WRITTEN:
        s = rounded_mul(a, scale, False) - m
        e = exp_ftz(s, False)
    else:
        s = a * scale - m
        e = tl.exp(s)
    tl.store(y + o, s + e)
'''

SCRIPT = '''
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
import kernels

def ptx(written):
    types = {"x": "*fp32", "y": "*fp32", "scale": "fp32", "m": "fp32", "WRITTEN": "constexpr"}
    source = ASTSource(kernels.written, types, constexprs={(4,): written}, attrs={})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]

ours, plain = ptx(True), ptx(False)
print(ours.count("mul.rn.f32"), ours.count("fma.rn.f32"), ours.count("ex2.approx.ftz.f32"), ours.count("ex2.approx.f32"))
print(plain.count("mul.rn.f32"), plain.count("fma.rn.f32"), plain.count("ex2.approx.ftz.f32"), plain.count("ex2.approx.f32"))
'''


@pytest.mark.skipif(not PTXAS.exists(), reason="needs Triton's ptxas")
def test_the_written_product_is_never_fused_and_the_exp_is_flushed_while_the_plain_ones_are_not(tmp_path):
    (tmp_path / "kernels.py").write_text(textwrap.dedent(KERNELS))
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    ours, plain = ([int(n) for n in line.split()] for line in result.stdout.split("\n")[:2])
    mul_rn, fma, ex2_ftz, ex2 = ours
    assert mul_rn > 0 and fma == 0 and ex2_ftz > 0 and ex2 == 0, ours
    mul_rn, fma, ex2_ftz, ex2 = plain  # the control: fused, and the exp that keeps subnormal results
    assert mul_rn == 0 and fma > 0 and ex2_ftz == 0 and ex2 > 0, plain
