"""linear.row_parallel.triton: correctness against float64 (odd leaf widths included), bitwise batch
invariance next to a batch-dependent variant, the same bits from tensor-parallel
shards of the leaves, gradients, refused constants, and admission through the battery.

Without a GPU the kernel runs in Triton's interpreter (see tests/ops/linear/test_triton.py), so
shapes are small and the battery probe is a reduced version of the family's own.
"""

from types import SimpleNamespace

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from isoexec.ops.linear import probe as linear_probe  # noqa: E402
from isoexec.ops.linear import row_parallel_triton  # noqa: E402
from isoexec.ops.linear import tuning  # noqa: E402
from isoexec.ops.linear.row_parallel_triton import combine_partials, leaf_partials  # noqa: E402
from isoexec.runtime import REGISTRY  # noqa: E402
from isoexec.validate.battery import hazard_rows  # noqa: E402
from ops.kernels_triton import _small_linear_probe  # noqa: E402
from ops.triton_impls import assert_admitted, assert_gradients_match_float64, registry_of, validate_pinned  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

TILES = dict(block_m=16, block_n=32, block_k=16, num_warps=4, num_stages=2)
ROW_PARALLEL = dict(input_dtype="float32", weight_dtype="float32", output_dtype="float32", accum_dtype="float32", **TILES,
                    num_leaves=4, leaf_tree="balanced_binary")


def poisoned(t: torch.Tensor) -> torch.Tensor:
    """The same values with NaN right after each row's end, so a read past K (or past the last leaf) shows."""
    wide = torch.full((*t.shape[:-1], t.shape[-1] + 16), float("nan"), dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def row_parallel(constants=ROW_PARALLEL):
    return lambda x, w, b=None: row_parallel_triton.row_parallel_linear(x, w, b, **constants)


@pytest.mark.parametrize("leaf_tree", ["balanced_binary", "sequential"])
@pytest.mark.parametrize("k", [64, 40, 72])  # leaf widths 16 = BLOCK_K, 10 < BLOCK_K, 18 = BLOCK_K + 2
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64(dtype, k, leaf_tree):
    x, w, b = randn(3, 5, k, seed=k, dtype=dtype), randn(20, k, seed=k + 1, dtype=dtype), randn(20, seed=k + 2, dtype=dtype)
    y = row_parallel(boundary(ROW_PARALLEL, dtype) | {"leaf_tree": leaf_tree})(poisoned(x), poisoned(w), b)
    exact = x.double() @ w.double().T + b.double()
    assert y.shape == (3, 5, 20) and y.dtype == dtype
    if dtype == torch.float32:
        assert (y.double() - exact).abs().max() < 1e-5
    else:  # one round to nearest from fp32
        assert ((y.double() - exact).abs() / (exact.abs() + 1)).max() < 2**-7


def test_gradients_match_float64():
    x, w, b = randn(2, 3, 40, seed=3), randn(12, 40, seed=4), randn(12, seed=5)
    g = randn(2, 3, 12, seed=6)
    assert_gradients_match_float64(row_parallel(), lambda x, w, b: x @ w.T + b, [x, w, b], g, 1e-4)


def _rows(dtype, k=40):
    """65 random rows and the battery's 6 hazard rows (signed zeros, subnormals, huge magnitudes, ties)."""
    x = torch.cat([randn(65, k, seed=7), hazards(k)]).to(dtype)
    return x, randn(24, k, seed=8, scale=k**-0.5, dtype=dtype), randn(24, seed=9, dtype=dtype)


SIZES = (1, 7, 33, 65)


@pytest.mark.parametrize("leaf_tree", ["balanced_binary", "sequential"])  # leaf planes then combine; one fused launch
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_bitwise_invariant(dtype, leaf_tree):
    x, w, b = _rows(dtype)
    op = row_parallel(boundary(ROW_PARALLEL, dtype) | {"leaf_tree": leaf_tree})
    assert batch_dependent(op, [x], w, b, sizes=SIZES) == []
    assert bitwise_equal(op(x.reshape(1, 71, 40), w, b)[0], op(x, w, b))


def test_a_batch_dependent_leaf_count_is_caught():
    """The same check must fail where the leaf count follows the batch size. (Native linear is no
    control: whether a BLAS changes its blocking with M depends on the library and the CPU model.)"""
    x, w, b = _rows(torch.float32)

    def leaves_from_rows(x, w, b):
        return row_parallel(ROW_PARALLEL | {"num_leaves": 2 if x.shape[0] < 8 else 4})(x, w, b)

    assert batch_dependent(leaves_from_rows, [x], w, b, sizes=SIZES), "the invariance check missed a batch-dependent leaf count"


@pytest.mark.parametrize("k", [64, 40, 72])  # leaf widths 16 = BLOCK_K, 10 < BLOCK_K, 18 = BLOCK_K + 2
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_launch_folds_the_leaves_as_the_combine_does(dtype, k):
    """With the sequential tree one device runs one fused kernel (no leaf planes); its bits are those of
    the leaf planes folded by `combine_partials`, which is what tensor-parallel ranks compute after
    gathering them. The control (fp32 shows it): the same planes under the balanced tree differ."""
    x, w, b = _fused_case(dtype, k)
    fused = row_parallel(boundary(ROW_PARALLEL, dtype) | {"leaf_tree": "sequential"})(poisoned(x), poisoned(w), b)
    planes = leaf_partials(x, w, num_leaves=4, **TILES)
    assert bitwise_equal(fused, combine_partials(planes, b, leaf_tree="sequential", out_dtype=dtype))
    if dtype == torch.float32:
        assert not bitwise_equal(fused, combine_partials(planes, b, leaf_tree="balanced_binary", out_dtype=dtype)), \
            "the comparison could not tell the two leaf trees apart"


@pytest.mark.parametrize("k", [512, 64])  # leaves of 8 BLOCK_K blocks (the op's persistent launch), of 1 block
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_persistent_launch_folds_the_leaves_as_the_grid_kernel_does(dtype, k, monkeypatch):
    """Where a layer's leaves are whole BLOCK_K blocks, PERSISTENT_MIN_LEAF_BLOCKS or more, the sequential
    fold runs in the persistent TMA kernel: its bits are the leaf planes' folded in order, and so the grid
    kernel's. At one block a leaf (called directly: the op takes the grid kernel there) the fold must not
    be rewritten into the leaf's dot (tile_triton). The control (fp32): the balanced tree differs."""
    from isoexec.ops.linear import persistent_triton

    x, w, b = _fused_case(dtype, k)
    expected = combine_partials(leaf_partials(x, w, num_leaves=4, **TILES), b, leaf_tree="sequential", out_dtype=dtype)
    persistent, grid = torch.empty_like(expected), torch.empty_like(expected)
    persistent_triton.linear_fwd_persistent(x, w, b, persistent, num_leaves=4, **TILES)
    row_parallel_triton.fused_grid(x, w, b, grid, num_leaves=4, **TILES)
    assert bitwise_equal(persistent, expected)
    assert bitwise_equal(grid, expected)
    assert row_parallel_triton.persistent_fits(k, dtype, 4, TILES["block_k"]) == (k == 512)
    if k == 512:  # the op itself takes the persistent launch
        monkeypatch.setattr(row_parallel_triton, "fused_grid", None)
        op = row_parallel(boundary(ROW_PARALLEL, dtype) | {"leaf_tree": "sequential"})
        assert bitwise_equal(op(x, w, b), expected)
    if dtype == torch.float32:
        balanced = combine_partials(leaf_partials(x, w, num_leaves=4, **TILES), b, leaf_tree="balanced_binary", out_dtype=dtype)
        assert not bitwise_equal(persistent, balanced), "the comparison could not tell the two leaf trees apart"


def _fused_case(dtype, k):
    return randn(33, k, seed=k + 20, dtype=dtype), randn(20, k, seed=k + 21, dtype=dtype), randn(20, seed=k + 22, dtype=dtype)


@pytest.mark.parametrize("leaf_tree", ["balanced_binary", "sequential"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tensor_parallel_shards_give_the_same_bits(tp, leaf_tree):
    """Rank r at TP = tp owns leaves [r G/tp, (r + 1) G/tp) and the K columns under them; the partials
    gathered along the leaves and combined by the same tree reproduce one device bit for bit (for the
    sequential tree, the one device runs the fused kernel)."""
    x, w, b = (randn(*shape, seed=seed, dtype=torch.bfloat16) for shape, seed in [((9, 72), 10), ((20, 72), 11), ((20,), 12)])
    whole = row_parallel(boundary(ROW_PARALLEL, torch.bfloat16) | {"leaf_tree": leaf_tree})(x, w, b)
    shard = 72 // tp
    ranks = [leaf_partials(x[:, r * shard : (r + 1) * shard], w[:, r * shard : (r + 1) * shard], num_leaves=4 // tp, **TILES)
             for r in range(tp)]
    gathered = torch.cat([p.permute(2, 0, 1) for p in ranks]).permute(1, 2, 0)  # as an all-gather of [G/tp, M, N] planes
    assert all(p.permute(2, 0, 1).is_contiguous() for p in ranks)
    assert bitwise_equal(combine_partials(gathered, b, leaf_tree=leaf_tree, out_dtype=torch.bfloat16), whole)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_the_forward_can_be_captured_in_a_cuda_graph():
    x, w, b = randn(33, 64, seed=13), randn(24, 64, seed=14), randn(24, seed=15)
    op = row_parallel()
    eager = op(x, w, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(x, w, b)
    graph.replay()
    assert bitwise_equal(captured, eager)


def _impl():
    registry = registry_of(row_parallel_triton)
    assert [impl.ref for impl in registry] == ["linear.row_parallel.triton@1"]
    return registry, registry.get("linear.row_parallel.triton", 1)


def test_registered_with_its_sources_and_refuses_bad_constants():
    _, impl = _impl()
    assert impl.region == "linear.row_parallel" and impl.source_sha256
    assert REGISTRY.get("linear.row_parallel.triton", 1).fn is row_parallel_triton.row_parallel_linear
    impl.check(boundary(ROW_PARALLEL, torch.bfloat16) | {"num_leaves": 8})
    for edit, message in [
        ({"num_leaves": 6}, "linear.row_parallel.triton: num_leaves must be a power of two >= 1"),
        ({"num_leaves": 0}, "num_leaves must be a power of two >= 1"),
        ({"leaf_tree": "pairwise"}, "leaf_tree must be one of balanced_binary, sequential, got 'pairwise'"),
        ({"block_k": 24}, "linear.row_parallel.triton: block_k must be a power of two >= 16"),
        ({"accum_dtype": "float64"}, "linear.row_parallel.triton accumulates in float32 only"),
        ({"block_tree": "sequential"}, "unsupported constants block_tree"),
    ]:
        with pytest.raises(ValueError, match=message):
            impl.check(ROW_PARALLEL | edit)
    with pytest.raises(ValueError, match="missing constants leaf_tree, num_leaves"):
        impl.check({k: v for k, v in ROW_PARALLEL.items() if k not in ("num_leaves", "leaf_tree")})


def test_a_shard_that_is_not_its_leaves_columns_is_refused():
    """Any K runs (its leaves cut by `reference.leaf_bounds`, tests/ops/linear/test_any_k.py); a rank's
    x and weight must hold exactly its leaves' columns of the whole K."""
    x, w = randn(2, 42, seed=16), randn(3, 42, seed=17)
    assert row_parallel()(x, w).shape == (2, 3)
    with pytest.raises(ValueError, match="K = 20 is not the width of leaves 2..3 of K = 42 in 4 leaves"):
        leaf_partials(x[:, :20], w[:, :20], num_leaves=4, global_k=42, leaves=range(2, 4), **TILES)
    with pytest.raises(ValueError, match="input has K = 40, weight has K = 32"):
        row_parallel()(randn(2, 40, seed=16), randn(3, 32, seed=17))


@pytest.mark.parametrize("leaf_tree", ["balanced_binary", "sequential"])
@pytest.mark.parametrize("tp", [2, 4])
def test_the_impls_leaf_parts_give_one_devices_bits(tp, leaf_tree):
    """`Impl.leaf_parts`, as parallel/ops.py runs them: each rank's partials on its leaves' columns, gathered in
    rank order and folded, equal the one-device op bit for bit, bias included (K = 72: leaves of 18 columns,
    BLOCK_K + 2, so a leaf's last block is masked). The control: ranks that fold their own partials first and
    add the rounded sums (the frameworks' all-reduce) give other bits."""
    constants = boundary(ROW_PARALLEL, torch.bfloat16) | {"leaf_tree": leaf_tree}
    x, w, b = randn(7, 72, seed=tp, dtype=torch.bfloat16), randn(24, 72, seed=tp + 1, dtype=torch.bfloat16), randn(24, seed=3, dtype=torch.bfloat16)
    partials, fold = REGISTRY.get(row_parallel_triton.ID, 1).leaf_parts
    shards = [(slice(18 * r * 4 // tp, 18 * (r + 1) * 4 // tp), range(r * 4 // tp, (r + 1) * 4 // tp)) for r in range(tp)]
    ranks = [partials(x[:, cols].contiguous(), w[:, cols].contiguous(), leaves=leaves, global_k=72, **constants) for cols, leaves in shards]
    assert all(r.shape == (7, 24, 4 // tp) for r in ranks)
    y = fold(torch.cat(ranks, dim=-1), b, **constants)
    assert bitwise_equal(y, row_parallel(constants)(x, w, b))
    rounded = [fold(r, None, **constants | {"num_leaves": 4 // tp}) for r in ranks]
    assert not bitwise_equal(sum(r.float() for r in rounded).bfloat16() + b, y)


def test_the_battery_admits_it():
    """linear's probe; under the interpreter its reduced version (tests/ops/kernels_triton.py)."""
    constants = boundary(ROW_PARALLEL, torch.bfloat16) | tuning.hopper_tile(64, 64) | {"num_leaves": 8}
    registry, _ = _impl()
    result = validate_pinned("linear.row_parallel", "linear.row_parallel.triton", constants,
                             linear_probe.probe if ON_GPU else _small_linear_probe, registry)
    assert_admitted(result, min_trials=60)


@pytest.mark.parametrize("leaf_tree", ["balanced_binary", "sequential"])
@pytest.mark.parametrize("leaves", [1, 2, 4, 8, 16])
def test_the_combine_kernel_adds_in_reduce_tree_sums_order(leaves, leaf_tree):
    """The one-kernel combine (G in KERNEL_LEAVES) against reduce.tree_sum on the same partials, bit for
    bit, with a bias; G = 16 takes the torch path. The hazard rows put signed zeros, subnormals and
    huge magnitudes among the leaves, where a different order of the additions shows."""
    ctx = SimpleNamespace(dtype=torch.float32, device=DEVICE, generator=torch.Generator().manual_seed(5))
    planes = torch.cat([torch.randn(leaves, 7, 96, generator=ctx.generator).to(DEVICE),
                        hazard_rows(ctx, 96 * leaves).reshape(6, leaves, 96).transpose(0, 1)], dim=1)  # [G, M, N]
    bias = torch.randn(96, generator=ctx.generator).to(DEVICE)
    got = combine_partials(planes.permute(1, 2, 0), bias, leaf_tree=leaf_tree, out_dtype=torch.float32)
    want = (row_parallel_triton.reduce.tree_sum(planes.permute(1, 2, 0).cpu(), leaf_tree) + bias.cpu()).to(torch.float32)
    assert bitwise_equal(got.cpu(), want)
    if leaves >= 4:  # the check can fail: adding the leaves in another order changes bits
        other = "sequential" if leaf_tree == "balanced_binary" else "balanced_binary"
        assert not bitwise_equal(got.cpu(), row_parallel_triton.reduce.tree_sum(planes.permute(1, 2, 0).cpu(), other) + bias.cpu())
