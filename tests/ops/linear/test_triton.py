"""linear.triton: correctness against float64, bitwise invariance to batch size, row position and
strides next to deliberately batch-dependent variants, its persistent launch, and admission through
the battery.

On a machine with a GPU the kernel is compiled for it. Without one it runs in Triton's interpreter
(numpy on the CPU, a few milliseconds per program), so shapes are small and the battery probe is a
reduced version of the family's own. Triton 3.6 fixes interpreted vs compiled when `triton` is first
imported (see `ops/triton_support.py`), so tests/conftest.py sets TRITON_INTERPRET before anything
imports it; if something imported it earlier without the variable, the module is skipped with that
reason (`require_triton`). What the linear, rms_norm and logprobs Triton tests share is in
tests/ops/kernels_triton.py; the tests that cover the three at once are in
tests/ops/triton/test_kernel_impls.py.
"""

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from isoexec.contract import load_preset  # noqa: E402
from isoexec.ops.linear import probe as linear_probe  # noqa: E402
from isoexec.ops.linear import triton as linear_triton  # noqa: E402
from isoexec.validate.battery import validate_entry  # noqa: E402
from ops.kernels_triton import LINEAR, _small_linear_probe, assert_the_battery_admits, linear, strided  # noqa: E402
from ops.triton_impls import assert_gradients_match_float64  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]


# linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_float64(dtype):
    x, w, b = randn(3, 11, 40, seed=0, dtype=dtype), randn(20, 40, seed=1, dtype=dtype), randn(20, seed=2, dtype=dtype)
    y = linear(boundary(LINEAR, dtype))(x, w, b)
    exact = x.double() @ w.double().T + b.double()
    assert y.shape == (3, 11, 20) and y.dtype == dtype
    if dtype == torch.float32:
        assert (y.double() - exact).abs().max() < 1e-5
    else:  # bf16 rounding; the interpreter truncates (< 1 ulp), the GPU rounds to nearest
        assert ((y.double() - exact).abs() / (exact.abs() + 1)).max() < 2**-7


def test_linear_gradients_match_float64():
    x, w, b = randn(5, 24, seed=3), randn(12, 24, seed=4), randn(12, seed=5)
    g = randn(5, 12, seed=6)
    assert_gradients_match_float64(linear(), lambda x, w, b: x @ w.T + b, [x, w, b], g, 1e-4)


def _linear_rows(dtype):
    x = torch.cat([randn(27, 40, seed=7), hazards(40)]).to(dtype)
    return x, randn(24, 40, seed=8, scale=40**-0.5, dtype=dtype), randn(24, seed=9, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_rows_are_bitwise_invariant(dtype):
    x, w, b = _linear_rows(dtype)
    op = linear(boundary(LINEAR, dtype))
    assert batch_dependent(op, [x], w, b) == []
    assert bitwise_equal(op(strided(x), w, b), op(x, w, b))
    assert bitwise_equal(op(x.reshape(3, 11, 40), w, b).reshape(33, 24), op(x, w, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_persistent_launch_gives_the_grid_kernels_bits(dtype):
    """linear.triton's persistent TMA launch (ops/linear/persistent_triton.py) and the one-program-per-tile
    grid kernel compute the same tiles: bit for bit equal at several M, with more tiles than programs,
    from contiguous and strided inputs, into NaN-poisoned outputs."""
    from isoexec.ops.linear import persistent_triton

    x, w, b = _linear_rows(dtype)
    assert persistent_triton.fits(x.shape[1], dtype)
    tiles = dict(block_m=16, block_n=16, block_k=16, num_warps=4, num_stages=1)

    def run(launch, x, **overrides):
        y = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=dtype, device=x.device)
        launch(x, w, b, y, **{**tiles, **overrides})
        return y

    grid = lambda x, w, b, y, **t: linear_triton.launch(x, w, b, y[None], **t)  # noqa: E731
    for rows in (1, 7, 33):
        assert bitwise_equal(run(persistent_triton.linear_fwd_persistent, x[:rows]), run(grid, x[:rows]))
    assert bitwise_equal(run(persistent_triton.linear_fwd_persistent, strided(x)), run(grid, x))
    if dtype == torch.float32 and not ON_GPU:  # the check can fail: in the interpreter another K blocking changes some row's bits
        assert not bitwise_equal(run(persistent_triton.linear_fwd_persistent, x, block_k=32), run(grid, x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_narrow_tile_changes_launch_with_the_rows_and_keeps_its_bits(dtype, monkeypatch):
    """A tile narrower than PERSISTENT_MIN_BLOCK_N (the decode tile) runs one program per tile below
    PERSISTENT_MIN_ROWS rows and persistently from there (moved to 7 here, so the batches cross it), and
    bfloat16 on a GPU takes the swapped launch up to SWAPPED_MAX_ROWS (moved to 2): every row keeps the
    bits it has alone, and every launch was taken."""
    from isoexec.ops.linear import persistent_triton, swapped_triton

    launched, swapped_rows = [], []
    persistent, swapped = persistent_triton.linear_fwd_persistent, swapped_triton.linear_fwd_swapped
    monkeypatch.setattr(linear_triton, "PERSISTENT_MIN_ROWS", 7)
    monkeypatch.setattr(swapped_triton, "SWAPPED_MAX_ROWS", 2)
    monkeypatch.setattr(persistent_triton, "linear_fwd_persistent", lambda x, *a, **k: launched.append(x.shape[0]) or persistent(x, *a, **k))
    monkeypatch.setattr(swapped_triton, "linear_fwd_swapped", lambda x, *a, **k: swapped_rows.append(x.shape[0]) or swapped(x, *a, **k))
    x, w, b = _linear_rows(dtype)
    op = linear({**boundary(LINEAR, dtype), "block_n": 16})
    assert batch_dependent(op, [x], w, b) == []
    assert sorted(set(launched)) == [7, 16, 33]
    assert sorted(set(swapped_rows)) == ([1, 2] if ON_GPU and dtype == torch.bfloat16 else [])
    x, w, b = x.float(), w.float(), b.float()  # the control computes in float32
    assert batch_dependent(_split_k_when_batched, [x], w, b), "the invariance check missed a batch-dependent linear"


def test_a_k_tma_cannot_take_runs_on_the_grid_kernel():
    """fp32 rows of 38 elements (152 bytes) are not 16-byte aligned: linear.triton falls back to the grid
    kernel for that layer, at every M; its rows stay batch-invariant where a split-K variant's do not."""
    from isoexec.ops.linear import persistent_triton

    x, w, b = randn(33, 38, seed=3), randn(24, 38, seed=4, scale=38**-0.5), randn(24, seed=5)
    assert not persistent_triton.fits(38, torch.float32)
    op = linear(LINEAR)
    assert batch_dependent(op, [x], w, b) == []
    assert batch_dependent(_split_k_when_batched, [x], w, b), "the invariance check missed a batch-dependent linear"
    torch.testing.assert_close(op(x, w, b).double(), x.double() @ w.double().T + b.double(), atol=1e-5, rtol=1e-5)


def _split_k_when_batched(x, w, b=None):
    """Split-K once the batch is large enough, as cuBLAS heuristics do: two K halves summed in fp32."""
    if x.shape[0] < 8:
        return linear()(x, w, b)
    tiles = {k: LINEAR[k] for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
    h = x.shape[1] // 2
    low = linear_triton.linear_fwd(x[:, :h], w[:, :h], None, torch.float32, **tiles)
    return (low + linear_triton.linear_fwd(x[:, h:], w[:, h:], b, torch.float32, **tiles)).to(x.dtype)


def _block_k_from_m(x, w, b=None):
    return linear({**LINEAR, "block_k": 16 if x.shape[0] < 8 else 32})(x, w, b)


@pytest.mark.parametrize("mutant", [
    _split_k_when_batched,
    pytest.param(_block_k_from_m, marks=pytest.mark.skipif(ON_GPU, reason="on sm_90 no tile constant was seen to change bits")),
])
def test_linear_batch_dependent_variants_are_caught(mutant):
    x, w, b = _linear_rows(torch.float32)
    assert batch_dependent(mutant, [x], w, b), "the invariance check missed a batch-dependent linear"


def test_linear_rows_beyond_the_slice_never_leak():
    buffer = torch.full((40, 32), float("nan"), device=DEVICE)
    buffer[:5] = randn(5, 32, seed=10)
    assert torch.isfinite(linear()(buffer[:5], randn(8, 32, seed=11))).all()


# admission


@pytest.mark.parametrize("region", ["linear"])
def test_the_battery_admits_the_triton_impl(region):
    assert_the_battery_admits(region)


@pytest.mark.parametrize("block_k,admitted", [(32, True), (16, False)])
def test_a_decode_tile_is_pinned_for_engine_decode_alone_and_proven_against_training(monkeypatch, block_k, admitted):
    """A tile given for engine_decode splits the fitted linear entry by case; the battery anchors the
    decode entry on trainer_fwd (another entry's tile), so a decode tile that keeps the K blocking is
    admitted and one that changes it (different bits) is rejected."""
    from isoexec.contract import fit_contract
    from isoexec.model import PRESETS
    from isoexec.ops.linear import tuning
    from isoexec.runtime import REGISTRY

    if ON_GPU and not admitted:
        pytest.skip("on sm_90 no tile constant, block_k included, was seen to change bits: the rejection is the interpreter's")
    decode = dict(block_m=16, block_n=16, block_k=block_k, num_warps=4, num_stages=2)
    monkeypatch.setitem(tuning.DECODE_TILES, "sm_90", lambda launches: decode)
    contract = fit_contract(load_preset("tiny-dense-triton"), PRESETS["tiny-dense"], arch="sm_90")
    entry = contract.entry("linear", "engine_decode")
    assert entry.cases == ("engine_decode",) and entry.constants["block_m"] == 16
    assert contract.entry("linear", "trainer_fwd").constants["block_m"] == 64
    result = validate_entry(contract, entry, linear_probe.probe if ON_GPU else _small_linear_probe, registry=REGISTRY, device=DEVICE)
    assert (result.status == "admitted") == admitted, result.failures[:3]
