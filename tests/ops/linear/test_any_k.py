"""Row-parallel leaves at a K the leaf count does not divide: the floor rule (`reference.leaf_bounds`),
the bits it keeps where the count divides K, tensor-parallel ranks that cut their own leaves, the
Triton kernels on the same rule, and the battery's trials at such a K.

Bitwise comparisons are of integer views (bf16 -> int16, fp32 -> int32). Each runs beside a control
built to differ: the same elementwise arithmetic with another leaf cut, block alignment or leaf tree,
so it differs by the same bits on every machine (no BLAS is involved).
"""

import os
import pathlib
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, boundary, randn, triton_runs_here
from controls import other_leaf_cut_row_parallel
from isoexec.contract import load_preset
from isoexec.model import dense_spec
from isoexec.ops.linear import persistent_triton, probe, reference, row_parallel_triton
from isoexec.ops.linear import triton as linear_triton
from isoexec.ops.linear.reference import combine_leaves, leaf_bounds, leaf_columns, leaf_partials, rank_leaves
from isoexec.ops.linear.row_parallel_triton import combine_partials
from isoexec.ops.reduce import blocked_sum
from isoexec.runtime.registry import REGISTRY, Impl, Registry
from isoexec.validate import geometry_of
from isoexec.validate.battery import hazard_rows, validate_entry

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

TREES = dict(block_k=16, block_tree="balanced_binary", tree="sequential")
C32 = dict(input_dtype="float32", weight_dtype="float32", output_dtype="float32", accum_dtype="float32", **TREES)
LEAVES = dict(num_leaves=8, leaf_tree="balanced_binary")
# Llama with hidden 72, intermediate 150 (down_proj K), head_dim 24, vocab 1000, 3 heads over 1 KV head.
ODD = dense_spec(architecture="LlamaForCausalLM", vocab_size=1000, hidden_size=72, intermediate_size=150, num_hidden_layers=2,
                num_attention_heads=3, num_key_value_heads=1, head_dim=24, rms_norm_eps=1e-6, rope_theta=5e5,
                max_position_embeddings=256, tie_word_embeddings=False, dtype="bfloat16")


def _bf16(c):
    return {**c, "input_dtype": "bfloat16", "weight_dtype": "bfloat16", "output_dtype": "bfloat16"}


def _rows(k, dtype=torch.float32, m=9, n=12, seed=0):
    """m random rows and the battery's 6 hazard rows of K = k, a weight [n, k] (CPU)."""
    g = torch.Generator().manual_seed(seed)
    ctx = SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"), generator=g)
    x = torch.cat([torch.randn(m, k, generator=g), hazard_rows(ctx, k)])
    return x.to(dtype), (torch.randn(n, k, generator=g) * max(1, k) ** -0.5).to(dtype)


def _partials(x, w, **extra):
    return leaf_partials(x, w, num_leaves=8, **TREES, accum=torch.float32, **extra)


@pytest.mark.parametrize("k", [1, 5, 37, 64, 132, 150, 200, 256, 12288])
@pytest.mark.parametrize("g", [1, 2, 4, 8, 16])
def test_leaf_i_covers_floor_i_k_over_g_and_a_rank_owns_floor_r_k_over_c(k, g):
    bounds = leaf_bounds(k, g)
    assert bounds == [i * k // g for i in range(g + 1)] and bounds[0] == 0 and bounds[-1] == k
    widths = {end - start for start, end in zip(bounds, bounds[1:])}
    assert widths <= {k // g, -(-k // g)}  # balanced
    if k % g == 0:
        assert widths == {k // g}  # the even split the contract always had
    for tp in (c for c in (1, 2, 4, 8, 16) if g % c == 0):
        for r in range(tp):
            assert leaf_columns(k, g, rank_leaves(g, r, tp)) == slice(r * k // tp, (r + 1) * k // tp)


def _even_split_partials(x, w, num_leaves, block_k, block_tree, tree):
    """The leaf partials as cut before any K was allowed: K reshaped into num_leaves equal leaves."""
    (m, k), n = x.shape, w.shape[0]
    xf = x.float().reshape(m, 1, num_leaves, k // num_leaves)
    wf = w.float().reshape(1, n, num_leaves, k // num_leaves)
    return blocked_sum(xf * wf, block_k, block_tree, tree)


@pytest.mark.parametrize("k", [64, 96, 200, 256])  # leaves of 8, 12, 25 (a partial second block) and 32 columns
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_where_the_leaves_divide_k_the_bits_are_the_even_splits(k, dtype):
    """No admitted bit moves: where 8 divides K the rule is the K/G-wide split. The control: the same
    partials under the other leaf tree give other bits of the output."""
    x, w = _rows(k, dtype, seed=k)
    even = _even_split_partials(x, w, 8, **TREES)
    assert bitwise_equal(_partials(x, w), even)
    c = C32 if dtype == torch.float32 else _bf16(C32)
    out = reference.row_parallel_linear(x, w, **c, **LEAVES)
    assert bitwise_equal(out, combine_leaves(even, "balanced_binary").to(dtype))
    if dtype == torch.float32:
        assert not bitwise_equal(out, combine_leaves(even, "sequential")), "the comparison could not tell two leaf trees apart"


def _shards(k, tp):
    """(columns, leaves) of each rank at TP = tp, over 8 leaves of K = k."""
    return [(leaf_columns(k, 8, rank_leaves(8, r, tp)), rank_leaves(8, r, tp)) for r in range(tp)]


def _control_cut_moves_a_bound(k, tp):
    """Whether ranks that cut their own shard into 8/tp leaves as if it were all of K (the control)
    put some leaf bound elsewhere than `leaf_bounds(k, 8)`."""
    starts = [cols.start + b for cols, _ in _shards(k, tp) for b in leaf_bounds(cols.stop - cols.start, 8 // tp)[:-1]]
    return starts != leaf_bounds(k, 8)[:-1]


@pytest.mark.parametrize("k", [150, 200, 37, 5])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_ranks_cut_their_own_leaves_and_reproduce_one_device(k, tp):
    """Rank r computes leaves rank_leaves(8, r, tp) on its columns alone, knowing only K and its first
    leaf; the gathered fp32 partials are one device's, and the same tree over them gives TP = 1's bf16
    output. The control: ranks that cut their shard as if it were all of K give other partials
    exactly where that cut moves a leaf bound (K = 37 at TP = 2, 4)."""
    x, w = _rows(k, torch.bfloat16, seed=k + tp)
    whole = _partials(x, w)
    for r, (cols, leaves) in enumerate(_shards(k, tp)):
        assert cols == slice(r * k // tp, (r + 1) * k // tp)
    ranks = torch.cat([_partials(x[:, cols], w[:, cols], global_k=k, leaves=leaves) for cols, leaves in _shards(k, tp)], -1)
    assert bitwise_equal(ranks, whole)
    gathered = combine_leaves(ranks, "balanced_binary").bfloat16()
    assert bitwise_equal(gathered, reference.row_parallel_linear(x, w, **_bf16(C32), **LEAVES))

    control = torch.cat([leaf_partials(x[:, cols], w[:, cols], num_leaves=8 // tp, **TREES, accum=torch.float32)
                         for cols, _ in _shards(k, tp)], -1)
    assert bitwise_equal(control, whole) == (not _control_cut_moves_a_bound(k, tp))


def test_the_control_cut_moves_a_leaf_bound_somewhere():
    assert {(k, tp) for k in (150, 200, 37, 5) for tp in (2, 4, 8) if _control_cut_moves_a_bound(k, tp)} >= {(37, 2), (37, 4)}


def test_a_shard_that_is_not_its_leaves_is_refused():
    x, w = _rows(150)
    with pytest.raises(ValueError, match="K = 74 is not the width of leaves 4..7 of K = 150 in 8 leaves"):
        _partials(x[:, 76:], w[:, 76:], global_k=150, leaves=range(4, 8))
    with pytest.raises(ValueError, match="not a contiguous run of the 8 leaves"):
        _partials(x, w, global_k=150, leaves=range(4, 12))
    with pytest.raises(ValueError, match="TP must divide the 8 leaves"):
        rank_leaves(8, 0, 3)


def _absolute_blocks_partial(x, w, start, end):
    """A leaf's sum with its blocks aligned to multiples of block_k in all of K (not to the leaf's own
    first column): the control for where blocks start."""
    pad = start % TREES["block_k"]
    xs = torch.cat([x.new_zeros(x.shape[0], pad), x[:, start:end]], -1).float()
    ws = torch.cat([w.new_zeros(w.shape[0], pad), w[:, start:end]], -1).float()
    return blocked_sum(xs[:, None] * ws[None], TREES["block_k"], TREES["block_tree"], TREES["tree"])


@pytest.mark.parametrize("k", [150, 132, 37])
def test_each_leaf_is_the_plain_linear_over_its_own_columns(k):
    """Inside a leaf, blocks of block_k start at the leaf's first column, the last may be partial: a
    leaf's partial is linear.reference (one leaf, fp32 out, so no rounding) over its columns alone.
    The control: blocks aligned to all of K's 16-column grid instead sum in another order."""
    x, w = _rows(k, torch.bfloat16, seed=k)
    partials = _partials(x, w)
    c = {**_bf16(C32), "output_dtype": "float32"}
    bounds = leaf_bounds(k, 8)
    for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
        assert bitwise_equal(partials[..., i].contiguous(), reference.linear(x[:, start:end], w[:, start:end], **c))
    aligned = torch.stack([_absolute_blocks_partial(x, w, s, e) for s, e in zip(bounds, bounds[1:])], -1)
    if k != 37:  # K = 37's leaves fit in one block, where the two alignments pair the products alike or not by the data
        assert not bitwise_equal(aligned, partials), "the comparison could not tell two block alignments apart"


@pytest.mark.parametrize("k", [1, 5, 37, 150])
def test_matches_float64_at_any_k(k):
    g = torch.Generator().manual_seed(k)
    x, w, b = torch.randn(33, k, generator=g), torch.randn(20, k, generator=g), torch.randn(20, generator=g)
    exact = x.double() @ w.double().T + b.double()
    assert (reference.row_parallel_linear(x, w, b, **C32, **LEAVES).double() - exact).abs().max() < 1e-5
    bf = reference.row_parallel_linear(x.bfloat16(), w.bfloat16(), b.bfloat16(), **_bf16(C32), **LEAVES)
    exact_bf = x.bfloat16().double() @ w.bfloat16().double().T + b.bfloat16().double()
    assert ((bf.double() - exact_bf).abs() / (exact_bf.abs() + 1)).max() < 2**-7


def _battery(fn, geometry=None):
    registry = Registry()
    honest = REGISTRY.get("linear.row_parallel.reference", 1)
    registry.register(Impl(id=honest.id, version=1, region="linear.row_parallel", cases=honest.cases, fn=fn))
    contract = load_preset("tiny-dense")
    entry = contract.entry("linear.row_parallel", "trainer_fwd")
    return validate_entry(contract, entry, REGISTRY.probe("linear.row_parallel"), registry=registry, device=torch.device("cpu"),
                          geometry=geometry)


def test_the_battery_probes_a_k_the_leaves_do_not_divide():
    """The probe's own rows include UNEVEN_K (8 leaves of 16 or 17 columns): an impl wrong only there,
    in small batches, is rejected without a model, and only by those trials. With the odd model's
    geometry its down_proj K = 150 is probed as well, and the honest reference is admitted there."""
    bounds = leaf_bounds(probe.UNEVEN_K, 8)
    assert {end - start for start, end in zip(bounds, bounds[1:])} == {16, 17}
    mutant = _battery(other_leaf_cut_row_parallel)
    assert mutant.status == "rejected"
    assert all(f"K = {probe.UNEVEN_K}: " in failure for failure in mutant.failures), mutant.failures[:3]
    geometry = geometry_of(ODD)
    assert 150 in geometry["linear_k"]
    fitted = _battery(other_leaf_cut_row_parallel, geometry)
    assert any("K = 150: " in failure for failure in fitted.failures)
    honest = _battery(REGISTRY.get("linear.row_parallel.reference", 1).fn, geometry)
    assert honest.status == "admitted", honest.failures[:3]


# linear.row_parallel.triton on the same rule. Without a GPU the kernels run in Triton's interpreter: small shapes.
needs_triton = pytest.mark.skipif(not triton_runs_here(), reason="needs Triton on a GPU or in the interpreter")
TILES = dict(block_m=16, block_n=32, block_k=16, num_warps=4, num_stages=2)
TRITON = dict(input_dtype="float32", weight_dtype="float32", output_dtype="float32", accum_dtype="float32", **TILES, **LEAVES)


def _triton_op(constants):
    return lambda x, w, b=None: row_parallel_triton.row_parallel_linear(x, w, b, **constants)


def _triton_partials(x, w, **extra):
    return row_parallel_triton.leaf_partials(x, w, num_leaves=8, **TILES, **extra)


def _poisoned(t):
    """The same values with NaN right after each row's end, so a read past the last leaf shows."""
    wide = torch.full((*t.shape[:-1], t.shape[-1] + 16), float("nan"), dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


@needs_triton
@pytest.mark.parametrize("leaf_tree", ["balanced_binary", "sequential"])  # leaf planes then combine; the fused kernel
@pytest.mark.parametrize("k", [37, 132])
def test_the_triton_leaves_match_float64_at_a_k_the_leaves_do_not_divide(k, leaf_tree):
    x, w, b = randn(2, 3, k, seed=k), randn(20, k, seed=k + 1), randn(20, seed=k + 2)
    y = _triton_op(TRITON | {"leaf_tree": leaf_tree})(_poisoned(x), _poisoned(w), b)
    assert ((y.double() - (x.double() @ w.double().T + b.double())).abs().max()) < 1e-5


@needs_triton
@pytest.mark.parametrize("k", [150, 37])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_triton_ranks_cut_their_own_leaves_and_reproduce_one_device(k, tp):
    """As for the reference: each rank's leaf planes on its columns alone are one device's planes,
    and both leaf trees over the gathered planes give one device's output (the sequential one runs the
    fused kernel there). The control: ranks cutting their shard as if it were all of K differ where
    that moves a leaf bound."""
    x, w, b = (randn(*shape, seed=seed, dtype=torch.bfloat16) for shape, seed in [((9, k), k), ((20, k), k + 1), ((20,), k + 2)])
    whole = _triton_partials(x, w)
    ranks = [_triton_partials(x[:, cols], w[:, cols], global_k=k, leaves=leaves) for cols, leaves in _shards(k, tp)]
    gathered = torch.cat([p.permute(2, 0, 1) for p in ranks]).permute(1, 2, 0)  # as an all-gather of [G/tp, M, N] planes
    assert bitwise_equal(gathered, whole)
    for leaf_tree in ("balanced_binary", "sequential"):
        one_device = _triton_op(boundary(TRITON, torch.bfloat16) | {"leaf_tree": leaf_tree})(x, w, b)
        assert bitwise_equal(combine_partials(gathered, b, leaf_tree=leaf_tree, out_dtype=torch.bfloat16), one_device)

    control = torch.cat([row_parallel_triton.leaf_partials(x[:, cols], w[:, cols], num_leaves=8 // tp, **TILES)
                         for cols, _ in _shards(k, tp)], -1)
    assert bitwise_equal(control, whole) == (not _control_cut_moves_a_bound(k, tp))


@needs_triton
def test_a_triton_leaf_plane_is_linear_triton_over_the_leafs_columns():
    """K = 132 in 8 leaves of 16 and 17 columns under 16-wide blocks: every leaf runs two blocks, the
    second all masked in a 16-wide leaf. Each plane is still linear.triton (fp32 out, no bias) over
    that leaf's columns alone, which runs one block there. The control: the same over columns one to
    the right (a ceil cut of the leaves) differs."""
    k = 132
    x, w = randn(7, k, seed=40), randn(20, k, seed=41)
    planes = _triton_partials(x, w)
    bounds = leaf_bounds(k, 8)
    shifted_differs = []
    for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
        alone = linear_triton.linear_fwd(x[:, start:end].contiguous(), w[:, start:end].contiguous(), None, torch.float32, **TILES)
        assert bitwise_equal(planes[..., i].contiguous(), alone)
        if 0 < start and end < k:
            shifted = linear_triton.linear_fwd(x[:, start + 1 : end + 1].contiguous(), w[:, start + 1 : end + 1].contiguous(), None,
                                               torch.float32, **TILES)
            shifted_differs.append(not bitwise_equal(planes[..., i].contiguous(), shifted))
    assert all(shifted_differs)


@needs_triton
@pytest.mark.parametrize("leaf_tree", ["balanced_binary", "sequential"])
def test_triton_rows_are_bitwise_invariant_at_a_k_the_leaves_do_not_divide(leaf_tree):
    """The control: a leaf count that follows the batch size is caught by the same check."""
    k = 132
    hazards = hazard_rows(SimpleNamespace(dtype=torch.float32, device=DEVICE, generator=torch.Generator().manual_seed(51)), k)
    x, w, b = torch.cat([randn(33, k, seed=50), hazards]), randn(24, k, seed=52, scale=k**-0.5), randn(24, seed=53)
    op = _triton_op(TRITON | {"leaf_tree": leaf_tree})
    assert batch_dependent(op, [x], w, b, sizes=(1, 7, 33)) == []

    def leaves_from_rows(x, w, b):
        return _triton_op(TRITON | {"leaf_tree": leaf_tree, "num_leaves": 4 if x.shape[0] < 8 else 8})(x, w, b)

    assert batch_dependent(leaves_from_rows, [x], w, b, sizes=(1, 7, 33)), "the invariance check missed a batch-dependent leaf count"


@needs_triton
def test_the_persistent_launch_is_not_taken_where_the_leaves_do_not_divide_k(monkeypatch):
    """A TMA box cannot stop inside a block, and leaves of two widths one apart cannot both be whole
    blocks: fp32 rows of K = 1028 are TMA-aligned and long enough, yet take the fused grid kernel,
    whose bits are the leaf planes folded in order (the control: the balanced fold differs)."""
    assert row_parallel_triton.persistent_fits(1024, torch.float32, 8, 16)
    assert not row_parallel_triton.persistent_fits(1028, torch.float32, 8, 16) and persistent_triton.fits(1028, torch.float32)
    monkeypatch.setattr(persistent_triton, "linear_fwd_persistent", None)
    x, w, b = randn(3, 1028, seed=60), randn(8, 1028, seed=61, scale=1028**-0.5), randn(8, seed=62)
    fused = _triton_op(TRITON | {"leaf_tree": "sequential"})(x, w, b)
    planes = _triton_partials(x, w)
    assert bitwise_equal(fused, combine_partials(planes, b, leaf_tree="sequential", out_dtype=torch.float32))
    assert not bitwise_equal(fused, combine_partials(planes, b, leaf_tree="balanced_binary", out_dtype=torch.float32))


def _ptxas():
    try:
        import triton
    except ImportError:
        return None
    return pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(ON_GPU or _ptxas() is None or not _ptxas().exists(),
                    reason="compiled on a GPU by the tests above; needs Triton's ptxas otherwise")
def test_the_uneven_leaf_kernels_compile_for_hopper(tmp_path):
    """The interpreter runs Python the compiler may refuse: compile the leaf-plane kernel (all leaves,
    and a rank's from leaf 4), the fused kernel and the swapped launch's fold at K = 150 in 8 leaves for
    sm_90 (and the swapped launch's joined parts)."""
    script = textwrap.dedent("""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from isoexec.ops.linear import row_parallel_triton, swapped_triton, triton as linear_triton
        target = GPUTarget("cuda", 90, 32)
        def build(kernel, constexprs):
            types = {name: "constexpr" if name in constexprs else "*bf16" if name in ("x", "w", "b") else "*fp32" if name == "y"
                     else "i32" for name in kernel.arg_names}
            triton.compile(ASTSource(kernel, types, constexprs=constexprs), target=target, options={"num_warps": 4})
        tile = dict(HAS_BIAS=False, DOT_IN_FP32=False, BLOCK_M=64, BLOCK_N=32, BLOCK_K=32)
        for first in (0, 4):
            build(linear_triton.linear_fwd_kernel, dict(K=150, G=8, FIRST_LEAF=first, NK=1, **tile))
        build(row_parallel_triton.fused_kernel, dict(K=150, G=8, NK=1, GROUP=8, **tile))
        swapped = dict(tile, BLOCK_M=16, BLOCK_N=64)
        build(swapped_triton.linear_swapped_kernel, dict(K=150, G=8, NK=1, **swapped))
        build(swapped_triton.linear_swapped_kernel, dict(K=150, G=1, NK=5, N1=128, N2=192, **swapped))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
