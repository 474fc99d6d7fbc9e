"""linear.triton's swapped launch (`swapped_triton.py`: each tile computed transposed, for a few rows):
its values against float64 with masks in every direction, its rows invariant to the batch, joined parts,
and, on a GPU, the grid kernel's bits at every row count it takes, and `linear.triton` taking it there.

The interpreter computes `tl.dot` through numpy, whose bits may depend on the operands' orientation, so
the comparison with the grid kernel's bits is a GPU test; the comparison's power to see a regrouped sum
is shown on the same inputs by a split-K control."""

import pytest
import torch

from conftest import INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, randn, require_triton

require_triton()

from isoexec.ops.linear import swapped_triton, tuning  # noqa: E402
from isoexec.ops.linear import triton as linear_triton  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

# K not a multiple of BLOCK_K, N not a multiple of SWAPPED_BLOCK_N: masked in every direction.
N, K = 200, 300
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]
LAUNCH = swapped_triton.linear_fwd_swapped  # kept from the test that counts calls of the module's


def _swapped(x, w, b=None, block_k=64, num_stages=2, splits=(0, 0), num_leaves=1):
    y = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    LAUNCH(x, w, b, y, block_k=block_k, num_stages=num_stages, splits=splits, num_leaves=num_leaves)
    return y


def _grid(x, w, b=None, **tile):
    y = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype, device=x.device)
    linear_triton.launch(x, w, b, y[None], **tile)
    return y


def _split_k_when_batched(x, w, b=None, **launch):
    """The control: from 8 rows on, K in two halves, each rounded to x's dtype, then added (split-K)."""
    if x.shape[0] < 8:
        return _swapped(x, w, b, **launch)
    half = x.shape[1] // 2
    low, high = _swapped(x[:, :half], w[:, :half], None, **launch), _swapped(x[:, half:], w[:, half:], b, **launch)
    return (low.float() + high.float()).to(x.dtype)


def _leaves_reversed(x, w, b, num_leaves, launch=None):
    """The fold's control: each leaf's product rounded to x's dtype, added last leaf first, in fp32."""
    from isoexec.ops.linear.reference import leaf_bounds

    launch = launch or (lambda x, w: _swapped(x, w))
    bounds = leaf_bounds(x.shape[1], num_leaves)
    leaves = [launch(x[:, lo:hi], w[:, lo:hi]).float() for lo, hi in zip(bounds, bounds[1:])]
    total = leaves[-1]
    for leaf in reversed(leaves[:-1]):
        total = total + leaf
    return (total + b.float()).to(x.dtype)


def _inputs(dtype, rows=21):
    return (randn(rows, K, seed=1, dtype=dtype), randn(N, K, seed=2, scale=K**-0.5, dtype=dtype),
            randn(N, seed=3, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swapped_matches_float64(dtype):
    x, w, b = _inputs(dtype)
    want = x.double() @ w.double().T + b.double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for rows in (1, 16, 21):  # 21: two row tiles, the second masked
        torch.testing.assert_close(_swapped(x[:rows], w, b).double(), want[:rows], atol=tol, rtol=tol)
    column_major = x.t().contiguous().t()  # the same values, strides (1, M)
    torch.testing.assert_close(_swapped(column_major, w).double(), want - b.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swapped_rows_are_batch_invariant(dtype):
    x, w, b = _inputs(dtype, rows=33)
    assert batch_dependent(lambda x, w, b: _swapped(x, w, b), [x], w, b) == []
    assert batch_dependent(_split_k_when_batched, [x], w, b), "the invariance check missed a batch-dependent linear"


@pytest.mark.parametrize("dtype", DTYPES)
def test_swapped_parts_are_bitwise_their_own_calls(dtype):
    widths = [128, 64, 64]
    x, w = randn(5, K, seed=4, dtype=dtype), randn(sum(widths), K, seed=5, scale=K**-0.5, dtype=dtype)
    b = randn(sum(widths), seed=6, dtype=dtype)
    y = _swapped(x, w, b, splits=(128, 192)).view(-1)
    start = 0
    for width, w_part, b_part in zip(widths, w.split(widths), b.split(widths)):
        assert bitwise_equal(y[5 * start : 5 * (start + width)].view(5, width), _swapped(x, w_part, b_part))
        start += width
    # the control: a part whose own call regroups its K sum is not the joined call's
    assert not bitwise_equal(y[: 5 * 128].view(5, 128), _split_k_when_batched(x.repeat(2, 1), w[:128], b[:128])[:5])
    with pytest.raises(ValueError, match="whole 64-column tiles"):
        _swapped(x, w[:160], splits=(96, 128))


def test_only_few_bfloat16_rows_on_a_gpu_take_it():
    x = torch.zeros(16, 64, dtype=torch.bfloat16)
    assert not swapped_triton.fits(x, 128)  # the CPU: the interpreter keeps one orientation
    if ON_GPU:
        assert swapped_triton.fits(x.cuda(), 128)
        assert not swapped_triton.fits(x.cuda().float(), 128)
        assert not swapped_triton.fits(torch.zeros(17, 64, dtype=torch.bfloat16, device="cuda"), 128)
        assert not swapped_triton.fits(x.cuda(), 192, splits=(96, 128))


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's numpy dot may add a transposed tile otherwise (module doc)")
@pytest.mark.parametrize("shape", [(N, K), (4096, 1024), (1024, 3072)])
def test_swapped_gives_the_grid_kernels_bits(shape, monkeypatch):
    """bf16 at every row count the launch takes, against the grid kernel under the Hopper training and
    decode tiles; and `linear.triton` taking the swapped launch for those rows, not for 17."""
    n, k = shape
    x, w = randn(17, k, seed=7, dtype=torch.bfloat16), randn(n, k, seed=8, scale=k**-0.5, dtype=torch.bfloat16)
    b = randn(n, seed=9, dtype=torch.bfloat16)
    tiles = [tuning.hopper_tile(4096, 4096), tuning.hopper_decode_tile(4096, 4096)]
    launched = []
    monkeypatch.setattr(swapped_triton, "linear_fwd_swapped", lambda x, *a, **t: launched.append(x.shape[0]) or LAUNCH(x, *a, **t))
    for tile in tiles:
        for rows in (1, 2, 7, 16):
            want = _grid(x[:rows], w, b, **tile)
            assert bitwise_equal(_swapped(x[:rows], w, b, block_k=tile["block_k"], num_stages=tile["num_stages"]), want)
            assert bitwise_equal(linear_triton.linear_fwd(x[:rows], w, b, torch.bfloat16, **tile), want)
        linear_triton.linear_fwd(x, w, b, torch.bfloat16, **tile)
    assert launched == [1, 2, 7, 16] * 2
    # the control: the same rows with K in two halves, each rounded, then added, differ from the grid's
    half = k // 2
    split = (_grid(x[:, :half], w[:, :half], None, **tiles[0]).float() + _grid(x[:, half:], w[:, half:], b, **tiles[0]).float())
    assert not bitwise_equal(split.to(torch.bfloat16), _grid(x, w, b, **tiles[0]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_leaves", [4, 7])  # 7 does not divide K = 300: leaves of 42 and 43 columns
def test_swapped_fold_of_leaves(dtype, num_leaves):
    """num_leaves = G: K's leaves folded in order (the row-parallel sequential tree): the product within
    tolerance, every row's bits the same alone and batched."""
    x, w, b = _inputs(dtype, rows=33)
    fold = lambda x, w, b: _swapped(x, w, b, block_k=32, num_leaves=num_leaves)  # noqa: E731
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fold(x, w, b).double(), x.double() @ w.double().T + b.double(), atol=tol, rtol=tol)
    assert batch_dependent(fold, [x], w, b) == []
    # the control: the leaves rounded and added in the other order
    assert not bitwise_equal(fold(x, w, b), _leaves_reversed(x, w, b, num_leaves))


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's numpy dot may add a transposed tile otherwise (module doc)")
@pytest.mark.parametrize("shape", [(N, 320), (N, K), (1024, 2048), (4096, 12288)])
def test_the_row_parallel_fold_takes_it_with_the_fused_kernels_bits(shape, monkeypatch):
    """linear.row_parallel.triton's sequential fold of 8 leaves, bf16 (K = 300: leaves of two widths): a few
    rows take the swapped launch, with the bits of the fused launch; 17 rows do not take it."""
    from isoexec.ops.linear import row_parallel_triton

    n, k = shape
    x, w = randn(17, k, seed=10, dtype=torch.bfloat16), randn(n, k, seed=11, scale=k**-0.5, dtype=torch.bfloat16)
    b = randn(n, seed=12, dtype=torch.bfloat16)
    tile = tuning.hopper_decode_tile(4096, 4096)
    fwd = lambda x: row_parallel_triton.fused_fwd(x, w, b, torch.bfloat16, num_leaves=8, **tile)  # noqa: E731
    monkeypatch.setattr(swapped_triton, "SWAPPED_MAX_ROWS", 0)
    wants = {rows: fwd(x[:rows]) for rows in (1, 2, 7, 16)}
    monkeypatch.setattr(swapped_triton, "SWAPPED_MAX_ROWS", 16)
    launched = []
    monkeypatch.setattr(swapped_triton, "linear_fwd_swapped", lambda x, *a, **t: launched.append(x.shape[0]) or LAUNCH(x, *a, **t))
    for rows, want in wants.items():
        assert bitwise_equal(fwd(x[:rows]), want)
    fwd(x)
    assert launched == [1, 2, 7, 16]
    # the control: the leaves rounded to bf16 and added in the other order (grid launches)
    grid = lambda x, w: _grid(x, w, **tile)  # noqa: E731
    assert not bitwise_equal(_leaves_reversed(x[:16], w, b, 8, grid), wants[16])
