"""Triton's interpreter computes `tl.dot` with a fixed order on every CPU (`triton_interpreter.fixed_order_dot`).

Its own `tl.dot` is numpy's matmul, so the bits of an interpreted kernel were those of numpy's BLAS,
which OpenBLAS picks by CPU model: with its Haswell/Zen kernels (what an AMD AVX2 machine gets) a row's
products are summed in another order depending on which row of the tile it sits in, and the Triton
kernels' invariance tests failed there while they passed on AVX-512 machines. Here: the fixed-order dot
is a function of each row alone, an interpreted GEMM gives the same bits under every OpenBLAS core type
this CPU can run, and the interpreter's BLAS dot (the control) is seen to depend on the row's place in
the tile under the Haswell kernels, where numpy's BLAS is an OpenBLAS that can be switched.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ON_GPU, require_triton

require_triton()

import triton.language as tl  # noqa: E402

from isoexec.ops import triton_interpreter, triton_support  # noqa: E402

pytestmark = pytest.mark.skipif(ON_GPU, reason="about the interpreter, which runs without a GPU")

# An OpenBLAS built with DYNAMIC_ARCH (numpy's wheels) picks its kernels from this variable when it is
# set. Haswell's run on any x86-64 CPU with AVX2; SkylakeX's need AVX-512.
CORE_TYPES = ("Haswell", "SkylakeX")


def _tile(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _rows_in_every_place(dot) -> int:
    """How many rows of a [64, 32] @ [32, 48] tile get other bits when moved to another row of it."""
    a, b, acc = _tile(0, (64, 32)), _tile(1, (32, 48)), np.zeros((64, 48), np.float32)
    full = dot(a, b, acc).view(np.int32)
    moved = 0
    for r in range(64):
        shifted = np.zeros_like(a)
        shifted[(r + 5) % 64] = a[r]
        moved += int((dot(shifted, b, acc)[(r + 5) % 64].view(np.int32) != full[r]).any())
    return moved


def test_the_fixed_order_dot_gives_a_row_the_same_bits_in_any_place_of_the_tile():
    assert _rows_in_every_place(triton_interpreter.fixed_order_dot) == 0


def test_the_fixed_order_dot_is_close_to_float64_and_adds_the_accumulator_last():
    a, b, acc = _tile(2, (16, 64)), _tile(3, (64, 16)), _tile(4, (16, 16))
    got = triton_interpreter.fixed_order_dot(a, b, acc)
    exact = a.astype(np.float64) @ b.astype(np.float64) + acc
    assert got.dtype == np.float32 and np.abs(got - exact).max() < 1e-4
    products = a[:, :, None] * b[None, :, :]  # [M, K, N], the same fp32 products
    expected = products[:, 0]
    for k in range(1, 64):
        expected = expected + products[:, k]
    assert (got.view(np.int32) == (expected + acc).view(np.int32)).all()


def test_the_interpreter_runs_tl_dot_through_it():
    from triton.runtime import interpreter

    assert getattr(interpreter.InterpreterBuilder.create_dot, "fixed_order", False)


@triton_support.jit
def _twice(x):
    return x + x


@triton_support.jit
def _sum_of_exp_twice(x_ptr, out_ptr, N: tl.constexpr):
    x = _twice(tl.load(x_ptr + tl.arange(0, N)))
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.exp(x), axis=0))


def test_the_faster_interpreter_runs_nested_helpers_and_restores_the_builtins_after_a_launch():
    """`triton_interpreter._install_faster_patching`: a kernel that calls a nested helper and Triton's own `tl.sum` computes
    what torch does, and after the launch every builtin is Triton's again."""
    from triton.runtime import interpreter

    assert getattr(interpreter._patch_lang, "faster", False)
    x = torch.linspace(-1, 1, 8)
    out = torch.empty(3)
    _sum_of_exp_twice[(3,)](x, out, N=8)
    assert torch.allclose(out, torch.exp(2 * x).sum().expand(3))
    # tl.core is left out: a nested call from Triton's own helpers (standard.py sees `core`) patches it for
    # the rest of the process, with or without this change.
    for pkg, name in ((tl, "program_id"), (tl, "load"), (tl, "arange"), (tl.tensor, "__add__"), (tl.math, "exp")):
        assert tl.core.is_builtin(getattr(pkg, name)), (pkg, name)


@triton_support.jit
def _sum_to_a_loaded_bound(x_ptr, n_ptr, out_ptr):
    n = tl.load(n_ptr + tl.program_id(0))
    total = 0.0
    for i in tl.range(0, n, num_stages=2):
        total += tl.load(x_ptr + n - 1 - i)
    tl.store(out_ptr + tl.program_id(0), total)


def test_a_for_loop_runs_to_a_loaded_bound():
    """`triton_interpreter._install_scalar_index`: a `for` whose bound is a loaded value runs its trips as a compiled
    kernel does (Triton 3.6's interpreter refused it under numpy 2.4: a scalar is a one-element array there)."""
    x, n = torch.arange(1.0, 11.0), torch.tensor([10, 3, 0], dtype=torch.int32)
    out = torch.full((3,), -1.0)
    _sum_to_a_loaded_bound[(3,)](x, n, out)
    assert out.tolist() == [55.0, 6.0, 0.0]


@triton_support.jit
def _offsets_and_products(x_ptr, out_ptr, big, M: tl.constexpr, N: tl.constexpr):
    rows, cols = tl.arange(0, M)[:, None], tl.arange(0, N)[None, :]
    wrapped = (rows * big + cols * 3 - 7).to(tl.float32)  # int32 products that overflow wrap as two's complement
    x = tl.load(x_ptr + rows * N + cols)
    tl.store(out_ptr + rows * N + cols, x * 2.0 + wrapped)


def test_the_lighter_front_end_keeps_every_value_and_every_shape_check():
    """`triton_interpreter._install_lighter_front_end`: integer offsets and products (overflowing ones too) and
    broadcasts compute what torch does; a block type made again from a shape has Triton's shape, numel and
    name; a shape Triton refuses is refused every time; a tuple's type, made when first read, is Triton's."""
    assert getattr(tl.block_type.__init__, "lighter", False)
    x = torch.randn(4, 8)
    out = torch.empty(4, 8)
    big = 2**30
    _offsets_and_products[(1,)](x, out, big, M=4, N=8)
    rows, cols = torch.arange(4)[:, None], torch.arange(8)[None, :]
    wrapped = (rows * big + cols * 3 - 7).to(torch.int32).to(torch.float32)  # int64, then wrapped to int32
    assert torch.equal(out.view(torch.int32), (x * 2.0 + wrapped).view(torch.int32))

    first, again = tl.block_type(tl.float32, [4, 8]), tl.block_type(tl.float32, [tl.constexpr(4), tl.constexpr(8)])
    assert first == again and list(again.shape) == [4, 8] and again.numel == 32 and again.name == first.name == "<['4', '8'], fp32>"
    for _ in range(2):
        with pytest.raises(ValueError, match="power of 2"):
            tl.block_type(tl.float32, [3, 8])
    pair = tl.tuple([tl.constexpr(2), tl.constexpr(5)])
    assert pair.type == tl.core._type_for_tuple_values(pair.values) and str(pair.type) == "[:constexpr_type[2],:constexpr_type[5]]"


def _openblas_core_types() -> list[str]:
    """The core types this machine's numpy BLAS can be switched between, [] where it is not an OpenBLAS
    with DYNAMIC_ARCH (then OPENBLAS_CORETYPE does nothing)."""
    config = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    if "openblas" not in config.get("name", "") or "DYNAMIC_ARCH" not in config.get("openblas configuration", ""):
        return []
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return [core for core in CORE_TYPES if core != "SkylakeX" or "avx512f" in flags] if "avx2" in flags else []


GEMM = """
import hashlib, os, sys, torch
os.environ["TRITON_INTERPRET"] = "1"
from isoexec.ops.linear import triton as linear_triton
g = torch.Generator().manual_seed(0)
x, w = torch.randn(37, 48, generator=g), torch.randn(40, 48, generator=g)
y = linear_triton.linear(x, w, None, input_dtype="float32", weight_dtype="float32", output_dtype="float32",
                         accum_dtype="float32", block_m=32, block_n=32, block_k=16, num_warps=4, num_stages=2)
alone = torch.cat([linear_triton.linear(x[i:i + 1], w, None, input_dtype="float32", weight_dtype="float32",
                   output_dtype="float32", accum_dtype="float32", block_m=32, block_n=32, block_k=16, num_warps=4,
                   num_stages=2) for i in range(37)])
print(hashlib.sha256(y.numpy().tobytes()).hexdigest(), bool(torch.equal(y.view(torch.int32), alone.view(torch.int32))))
"""

def _run(code: str, core: str) -> str:
    env = {**os.environ, "OPENBLAS_CORETYPE": core, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(not _openblas_core_types(), reason="numpy's BLAS here is not an OpenBLAS whose kernels can be switched")
def test_an_interpreted_gemm_gives_the_same_bits_under_every_blas_core_type():
    runs = {core: _run(GEMM, core) for core in _openblas_core_types()}
    digests = {out.split()[0] for out in runs.values()}
    assert len(digests) == 1, runs
    assert all(out.endswith("True") for out in runs.values()), runs  # rows alone equal rows in the batch


BLAS_ROWS = """
import numpy as np
rng = np.random.default_rng(0)
a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
full = np.matmul(a, b, dtype=np.float32).view(np.int32)
moved = 0
for r in range(64):
    shifted = np.zeros_like(a)
    shifted[(r + 5) % 64] = a[r]
    moved += int((np.matmul(shifted, b, dtype=np.float32)[(r + 5) % 64].view(np.int32) != full[r]).any())
print(moved)
"""


@pytest.mark.skipif("Haswell" not in _openblas_core_types(), reason="numpy's BLAS here is not an OpenBLAS whose kernels can be switched")
def test_the_control_the_blas_dot_under_haswell_kernels_depends_on_the_row_place():
    """Why the interpreter's own dot could not stay: under OpenBLAS's Haswell kernels most rows of a
    64-row tile get other bits in another row of it (the microkernel's row tail rounds differently)."""
    assert int(_run(BLAS_ROWS, "Haswell")) > 0
