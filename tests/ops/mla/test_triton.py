"""mla.triton: values against float64 decompressed attention and mla.reference, bitwise invariance of a
row alone, in batches, in prefill chunks, in decode steps and over a poisoned paged store (next to a
control that re-blocks the keys by batch size), heads that do not fill a power of two, the battery's
admission, gradients, refused constants, and the kernels compiled for sm_90 at GLM-4.7-Flash's shapes.

Without a GPU the kernels run in Triton's interpreter (tests/ops/linear/test_triton.py has why
TRITON_INTERPRET must be set before `triton` is imported), on small shapes and a reduced probe; the
interpreter rounds fp32 -> bf16 by truncation, so bf16 values are compared by tolerance only. On a GPU
the same tests run compiled, the battery runs the full probe, and the GPU-only tests run at
GLM-4.7-Flash's shapes.
"""

import functools
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import BATTERY_DTYPES, DEVICE, INTERPRETER_WARNINGS, ON_GPU, bitwise_equal, int_view, require_triton

require_triton()

from isoexec.ops.attention.metadata import packed_slot_table  # noqa: E402
from isoexec.ops.mla import probe, tuning  # noqa: E402
from isoexec.ops.mla import triton as mla_triton  # noqa: E402
from isoexec.runtime.registry import REGISTRY  # noqa: E402
from isoexec.validate.battery import validate_entry  # noqa: E402
from ops.triton_impls import assert_import_and_register_nothing_without_triton  # noqa: E402

from .test_reference import (BAD_SHAPES, SCALE, PagedStore, make_seqs, make_weight, math_mla, mla_contract,  # noqa: E402
                             reference_op, run_decode, run_packed, run_prefill)

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

CONSTANTS = dict(input_dtype="float32", output_dtype="float32", kv_cache_dtype="float32", weight_dtype="float32", accum_dtype="float32",
                 block_m=16, block_n=16, block_k=16, gemm_block_m=16, gemm_block_n=32, gemm_num_warps=4, value_split=1, num_warps=4,
                 num_stages=2, split_kv_size=0)
BF16 = {**CONSTANTS, **{k: "bfloat16" for k in ("input_dtype", "output_dtype", "kv_cache_dtype", "weight_dtype")}}


def constants_for(dtype, **changes):
    return {**(BF16 if dtype == torch.bfloat16 else CONSTANTS), **changes}


def triton_op(dtype=torch.float32, **changes):
    """mla.triton bound to the test constants; takes and returns CPU tensors, runs on DEVICE."""
    bound = REGISTRY.get("mla.triton", 1).bind(constants_for(dtype, **changes))

    def op(*args, **kwargs):
        moved = [a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args]
        return bound(*moved, **kwargs).cpu()

    return op


def bits_equal_all(results: dict) -> list[str]:
    """The forms whose output differs in any bit from the first one's."""
    (_, first), *rest = results.items()
    return [form for form, out in rest if not bitwise_equal(out, first)]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
def test_packed_matches_float64_and_the_reference(dtype, tol):
    lengths = (1, 7, 16, 23, 40)  # partial, exact and several key blocks
    seqs, weight = make_seqs(lengths, dtype), make_weight(dtype)
    outs = run_packed(triton_op(dtype), seqs, weight)
    references = run_packed(reference_op(dtype), seqs, weight)
    for (q_nope, q_rope, rows), out, ref in zip(seqs, outs, references):
        assert out.dtype == dtype and out.shape == ref.shape
        torch.testing.assert_close(out.double(), math_mla(q_nope, q_rope, rows, weight), atol=tol, rtol=tol)
        torch.testing.assert_close(out.double(), ref.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("form", ["prefill in chunks of 7", "decode"])
def test_paged_forms_over_a_poisoned_store_match_float64(form):
    """Shuffled pages whose unwritten slots hold NaN: the rows stay finite and correct."""
    seqs, weight = make_seqs((1, 16, 23)), make_weight()
    run = functools.partial(run_prefill, chunk=7) if form != "decode" else run_decode
    for (q_nope, q_rope, rows), out in zip(seqs, run(triton_op(), seqs, weight)):
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), math_mla(q_nope, q_rope, rows, weight), atol=2e-6, rtol=2e-6)


def test_any_widths_are_padded_for_the_dots():
    """dn, dr, r and dv that are no power of two (DeepSeek-V3's shape class, the tiny preset's dr = 8):
    the rope and latent parts are padded with zeros inside the kernel, dn and dv masked in the GEMMs."""
    seqs = make_seqs((5, 19), nope=12, rope=4, rank=20)
    weight = make_weight(nope=12, rank=20, value=6)
    for (q_nope, q_rope, rows), out in zip(seqs, run_packed(triton_op(), seqs, weight)):
        torch.testing.assert_close(out.double(), math_mla(q_nope, q_rope, rows, weight, SCALE), atol=2e-6, rtol=2e-6)


def interleaved(op, target, other, weight):
    """The target's queries in runs of two, a query of `other` between each run and the next query:
    tiles cut where another sequence's query comes between two positions of the target."""
    store = PagedStore([target, other])
    n, m = target[0].shape[0], other[0].shape[0]
    for b, seq in enumerate([target, other]):
        store.rows[store.slot_table[b, : seq[0].shape[0]]] = seq[2]
    pieces = []
    for p in range(0, n, 3):
        spans = [(0, p, min(p + 2, n)), (1, p % m, p % m + 1)] + ([(0, p + 2, p + 3)] if p + 2 < n else [])
        outs = store.step(op, weight, spans)
        pieces += [outs[0]] + ([outs[2]] if p + 2 < n else [])
    return torch.cat(pieces)


def forms(op, dtype, num_heads=4, length=37, others=(16, 5, 23)):
    """Sequence `length` in every form, the first its packed batch alone; the others' lengths cross
    block and chunk edges (the last one's queries cut the target's runs of two)."""
    (target,) = make_seqs((length,), dtype, num_heads=num_heads, seed=3)
    others = make_seqs(others, dtype, num_heads=num_heads, seed=4)
    weight = make_weight(dtype, num_heads=num_heads)
    yield "alone", run_packed(op, [target], weight)[0]
    yield "packed after 2 others", run_packed(op, [*others[:2], target], weight)[2]
    for chunk in (16, 5):
        yield f"prefill in chunks of {chunk}", run_prefill(op, [target, *others], weight, chunk)[0]
    yield "prefill alone", run_prefill(op, [target], weight, 37)[0]
    yield "decode among others", run_decode(op, [*others, target], weight)[-1]
    yield "runs of two split by another sequence's query", interleaved(op, target, others[-1], weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_has_the_same_bits_in_every_form(dtype):
    results = dict(forms(triton_op(dtype), dtype))
    assert torch.isfinite(results["alone"]).all()
    assert bits_equal_all(results) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_probes_signed_zero_rows_keep_their_bits(dtype):
    """The probe's length-70 hazard (the reduced probe below leaves it out): negative latents in keys
    [0, 16), then -0.0 latents under rope keys so large that alpha = 0 in [16, 32), where row 31 sees
    only those, then tied rows and more -0.0 latents. Its rows in decode steps and in short chunks
    that start and stop around the hazards are the packed sequence's bits; row 31's output is +0.0
    (every zero is: README.md), where mla.reference gives -0.0."""
    ((q_nope, q_rope, rows),) = make_seqs((70,), dtype, seed=7)
    seq = probe.Sequence(q_nope, q_rope, rows)
    probe._signed_zero_and_ties(None, probe.Dims(4, 16, 8, 32, 16), seq)
    weight = make_weight(dtype)
    weight.view(4, 32, 32)[0, 16:] = weight.view(4, 32, 32)[0, 16:].abs()  # head 0's W_UV positive
    op, seqs = triton_op(dtype), [(seq.q_nope, seq.q_rope, seq.rows)]
    packed = run_packed(op, seqs, weight)[0]
    assert bitwise_equal(packed[31, 0], torch.zeros(16, dtype=dtype))
    store = PagedStore(seqs)
    store.step(op, weight, [(0, 0, 70)])  # writes every row
    for start, stop in ((31, 32), (30, 33), (28, 36), (31, 48), (15, 17), (39, 41), (55, 67)):
        (out,) = store.step(op, weight, [(0, start, stop)])
        assert bitwise_equal(out, packed[start:stop]), (start, stop)


def test_the_comparison_sees_a_key_block_chosen_from_the_batch():
    """The control: a variant whose key block doubles for calls of more than 2 queries re-blocks the
    online softmax of packed and prefill rows; in float32 the same comparison sees it."""
    small, large = triton_op(block_n=16), triton_op(block_n=32)

    def control(q_nope, *args, **kwargs):
        return (small if q_nope.shape[0] <= 2 else large)(q_nope, *args, **kwargs)

    (target,), weight = make_seqs((37,), seed=3), make_weight()
    assert not bitwise_equal(run_decode(control, [target], weight)[0], run_packed(control, [target], weight)[0])


@pytest.mark.parametrize("num_heads, block_m", [(5, 16), (6, 4)])
def test_heads_that_do_not_fill_a_power_of_two(num_heads, block_m):
    """5 heads in 16-row tiles: 3 queries a tile (15 rows), tiles cut at absolute blocks of 3 positions,
    as GLM-4.7-Flash's 20 heads in 64 rows; 6 heads in tiles of 4 rows (padded to 16): two groups of 3
    heads, as a model with more heads than block_m. The same bits in every form, and correct.
    Among two others (an exact key block and a short one): the interpreter runs a program per token and head group."""
    assert mla_triton.tile_shape(5, 16) == (5, 1, 3, 16) and mla_triton.tile_shape(6, 4) == (3, 2, 1, 16)
    assert mla_triton.tile_shape(20, 64) == (20, 1, 3, 64) and mla_triton.tile_shape(128, 64) == (64, 2, 1, 64)
    length = 19  # 16 + 3 positions: a full key block and a partial one, tiles of 3 queries cut at 3, 6, ..., 18
    results = dict(forms(triton_op(block_m=block_m), torch.float32, num_heads, length, others=(16, 5)))
    assert bits_equal_all(results) == []
    (target,) = make_seqs((length,), num_heads=num_heads, seed=3)
    want = math_mla(*target, make_weight(num_heads=num_heads))
    torch.testing.assert_close(results["alone"].double(), want, atol=2e-6, rtol=2e-6)


@pytest.mark.skipif(ON_GPU, reason="on a GPU the MMA shapes these constants choose may decide bits; the battery proves the pinned ones")
def test_tile_constants_leave_every_bit_in_the_interpreter():
    """block_m (queries per tile), value_split (value columns per program), the GEMM tile, warps and
    stages only regroup rows and columns: in the interpreter every output keeps its bits. block_n and
    block_k re-block sums, and the same comparison sees them (the control)."""
    seqs, weight = make_seqs((37, 1, 20)), make_weight()
    base = torch.cat(run_packed(triton_op(), seqs, weight))
    for change in ({"block_m": 32}, {"block_m": 64, "num_warps": 8}, {"value_split": 2}, {"gemm_block_m": 64, "gemm_block_n": 16},
                   {"num_stages": 1}):
        assert bitwise_equal(torch.cat(run_packed(triton_op(**change), seqs, weight)), base), change
    for change in ({"block_n": 32}, {"block_k": 32}):
        assert not bitwise_equal(torch.cat(run_packed(triton_op(**change), seqs, weight)), base), change


def test_rows_that_see_nothing_and_empty_batches():
    ((q_nope, q_rope, rows),) = make_seqs((5,))
    weight = make_weight()
    slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, 5]))
    out = triton_op()(q_nope, q_rope, rows, weight, torch.full_like(slot_table, -1), seq_ids, positions, SCALE)
    assert bitwise_equal(out, torch.zeros(5, 4, 16))  # +0.0 everywhere
    empty = torch.empty(0, dtype=torch.int64)
    out = triton_op()(q_nope[:0], q_rope[:0], rows, weight, slot_table, empty, empty, SCALE)
    assert out.shape == (0, 4, 16) and out.dtype == torch.float32


def test_gradients_match_float64_autograd_of_the_math():
    """The backward recomputes in native's decompressed form: q_nope, q_rope, the rows and kv_b_weight."""
    lengths = (3, 9)
    seqs, weight = make_seqs(lengths), make_weight()
    leaves = [torch.cat(parts).requires_grad_() for parts in zip(*seqs)] + [weight.clone().requires_grad_()]
    slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, 3, 12]))
    op = REGISTRY.get("mla.triton", 1).bind(CONSTANTS)
    device_leaves = [t.detach().to(DEVICE).requires_grad_() for t in leaves]
    out = op(*device_leaves, slot_table.to(DEVICE), seq_ids.to(DEVICE), positions.to(DEVICE), SCALE, 9)
    ours = torch.autograd.grad(out.square().sum(), device_leaves)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    parts = zip(*(t.split(lengths) for t in exact[:3]))
    expected = torch.cat([math_mla(*part, exact[3]) for part in parts])
    theirs = torch.autograd.grad(expected.square().sum(), exact)
    for name, got, want in zip(("q_nope", "q_rope", "rows", "kv_b_weight"), ours, theirs):
        torch.testing.assert_close(got.cpu().double(), want, atol=1e-4, rtol=1e-4, msg=name)


# Under the interpreter: the rows of ±0.0 only (ties at ±0, signed-zero values), scores near 1e30 and
# a one-token sequence; the signed-zero hazard of length 70 takes the full probe (on a GPU).
SMALL_PROBE = functools.partial(probe.probe, lengths=(17, 16, 1))


def test_the_battery_admits_mla_triton():
    contract = mla_contract("mla.triton", BF16)
    result = validate_entry(contract, contract.entry("mla", "trainer_fwd"), probe.probe if ON_GPU else SMALL_PROBE, registry=REGISTRY,
                            device=DEVICE, dtypes=BATTERY_DTYPES)
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == BATTERY_DTYPES and result.trials >= 50


BAD_CONSTANTS = [
    ({"split_kv_size": 64}, "split_kv_size must be 0"),
    ({"accum_dtype": "float64"}, "float32 only"),
    ({"kv_cache_dtype": "bfloat16"}, "must match"),
    ({"output_dtype": "float64"}, "output_dtype must be one of"),
    ({"block_m": 12}, "block_m must be a power of two"),
    ({"value_split": 3}, "value_split must be a power of two"),
    ({"block_n": 8}, "block_n must be >= 16"),
    ({"gemm_block_m": 8}, "gemm_block_m must be >= 16"),
    ({"gemm_num_warps": 3}, "gemm_num_warps must be a power of two"),
    ({"num_stages": 0}, "num_stages must be >= 1"),
]


@pytest.mark.parametrize("change, message", BAD_CONSTANTS)
def test_bad_constants_are_refused_in_one_line(change, message):
    with pytest.raises(ValueError, match=message) as error:
        mla_triton.check_constants({**CONSTANTS, **change})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("bad", [*BAD_SHAPES, "value chunks narrower than a dot"])
def test_bad_shapes_are_refused_in_one_line(bad):
    ((q_nope, q_rope, rows),) = make_seqs((3,))
    args, changes, message = (q_nope, q_rope, rows, make_weight()), {"value_split": 4}, "value_split 4 leaves chunks of 8"
    if bad in BAD_SHAPES:
        edit, message = BAD_SHAPES[bad]
        args, changes = edit(*args), {}
    slot_table, seq_ids, positions = torch.arange(rows.shape[0])[None], torch.zeros(3, dtype=torch.int64), torch.arange(3)
    with pytest.raises(ValueError, match=message) as error:
        triton_op(**changes)(*args, slot_table, seq_ids, positions, SCALE)
    assert "\n" not in str(error.value)


def test_the_tuning_table_holds_valid_constants_and_fits_glm():
    from isoexec.model import PRESETS

    for shape in ((4, 16, 8, 32, 16), (20, 192, 64, 512, 256), (128, 128, 64, 512, 128), (16, 128, 64, 1024, 128)):
        changes = tuning.hopper_tile(*shape)
        mla_triton.check_constants({**BF16, **changes})
        mla_triton.check_geometry({**BF16, **changes}, {"mla": {"kv_lora_rank": shape[3]}})
    cases = ["trainer_fwd", "engine_decode"]
    assert tuning.fit(["mla_attn"], cases, PRESETS["glm-4.7-flash-4l-random"], "sm_90") == [(cases, tuning.hopper_tile(20, 192, 64, 512, 256))]
    assert tuning.fit(["mla_attn"], cases, PRESETS["tiny-mla"], "sm_80") is None


def test_without_triton_the_module_imports_and_registers_nothing():
    assert_import_and_register_nothing_without_triton("isoexec.ops.mla.triton")


def _ptxas():
    try:
        import triton
    except ImportError:
        return None
    return pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(ON_GPU or _ptxas() is None or not _ptxas().exists(), reason="compiled on the GPU by the tests; needs Triton's ptxas otherwise")
def test_the_kernels_compile_for_hopper_at_glm_shapes(tmp_path):
    """The interpreter runs Python the compiler may refuse: the attention kernel and both GEMMs with
    the Hopper constants at GLM-4.7-Flash's shapes (20 heads, r 512, dr 64, dn 192, dv 256) in bf16, each
    within an SM's shared memory. The battery's fp32 pass (one pipeline stage, 4 heads) is checked for its
    stage count only: its kernel spills and takes a minute to compile here; the GPU tests compile and run it."""
    script = textwrap.dedent("""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from isoexec.ops.mla import triton as mt, tuning
        c = tuning.hopper_tile(20, 192, 64, 512, 256)
        target = GPUTarget("cuda", 90, 64)
        def build(kernel, dtype, constexprs, num_warps, num_stages):
            types = {n: "constexpr" if n in constexprs else f"*{dtype}" if n in ("q_lat", "q_rope", "store", "o", "x", "w", "y")
                     else "*i64" if n in ("slot_table", "seq_ids", "positions") else "fp32" if n == "scale" else "i32"
                     for n in kernel.arg_names}
            compiled = triton.compile(ASTSource(kernel, types, constexprs=constexprs), target=target,
                                      options={"num_warps": num_warps, "num_stages": num_stages})
            assert compiled.metadata.shared <= 232448, compiled.metadata.shared
        for dtype, size in (("bf16", 2), ("fp32", 4)):  # the GEMMs in bf16 only: the fp32 pass only takes fewer stages
            h_tile, _, block_q, rows = mt.tile_shape(20 if dtype == "bf16" else 4, c["block_m"])
            stages = mt.attention_stages(c["num_stages"], rows, c["block_n"], 512, 64, c["value_split"], size)
            assert stages == (2 if dtype == "bf16" else 1), stages
            if dtype == "fp32":
                continue
            build(mt.mla_attn_fwd_kernel, dtype, dict(H=20 if dtype == "bf16" else 4, H_TILE=h_tile, R=512, R_PAD=512, DR=64, DR_PAD=64,
                  V_SPLIT=c["value_split"], DOT_IN_FP32=False, SUM_BY_DOT=dtype == "fp32", BLOCK_Q=block_q, BLOCK_N=c["block_n"],
                  ROWS=rows), c["num_warps"], stages)
            for k in (192, 512) if dtype == "bf16" else ():
                tile = dict(BLOCK_M=c["gemm_block_m"], BLOCK_N=c["gemm_block_n"], BLOCK_K=c["block_k"])
                stages = mt.pipeline_stages(c["num_stages"], c["gemm_block_m"], c["gemm_block_n"], c["block_k"], size)
                build(mt.head_linear_kernel, dtype, dict(K=k, NK=triton.cdiv(k, c["block_k"]), DOT_IN_FP32=False, **tile),
                      c["gemm_num_warps"], stages)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


GLM = dict(num_heads=20, nope=192, rope=64, rank=512, value=256)


def _glm_op(dtype):
    name = str(dtype).removeprefix("torch.")
    constants = {**BF16, **tuning.hopper_tile(20, 192, 64, 512, 256)}
    constants.update({k: name for k in ("input_dtype", "output_dtype", "kv_cache_dtype", "weight_dtype")})
    bound = REGISTRY.get("mla.triton", 1).bind(constants)
    return lambda *args, **kwargs: bound(*(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args), **kwargs).cpu()


@pytest.mark.skipif(not ON_GPU, reason="GLM-4.7-Flash's shapes with the Hopper constants: compiled on a GPU")
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_glm_shapes_on_the_gpu_are_invariant_and_close_to_the_reference(dtype, tol):
    """Sequences of 70 and 33 tokens at GLM-4.7-Flash's widths: every decode row and prefill chunk row
    bitwise the trainer's packed row (64-row tiles for decode and training alike), within tolerance of
    mla.reference and of float64."""
    seqs = make_seqs((70, 33), dtype, num_heads=20, nope=192, rope=64, rank=512, seed=5)
    weight = make_weight(dtype, num_heads=20, nope=192, rank=512, value=256)
    op = _glm_op(dtype)
    packed = run_packed(op, seqs, weight)
    for form, run in (("decode", run_decode), ("prefill in chunks of 7", functools.partial(run_prefill, chunk=7))):
        for b, out in enumerate(run(op, seqs, weight)):
            assert bitwise_equal(out, packed[b]), (form, b, int((int_view(out) != int_view(packed[b])).sum()))
    for (q_nope, q_rope, rows), out in zip(seqs, packed):
        want = math_mla(q_nope, q_rope, rows, weight, SCALE)  # run_packed's scale
        assert (out.double() - want).abs().max() < tol * max(1.0, float(want.abs().max()))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_a_decode_step_can_be_captured_in_a_cuda_graph():
    seqs = make_seqs((40, 9, 17), torch.bfloat16, num_heads=20, nope=192, rope=64, rank=512, seed=6)
    weight = make_weight(torch.bfloat16, num_heads=20, nope=192, rank=512, value=256).cuda()
    store = PagedStore(seqs)
    for b, (q, _, rows) in enumerate(seqs):
        store.rows[store.slot_table[b, : q.shape[0]]] = rows
    q_nope = torch.stack([q[-1] for q, _, _ in seqs]).cuda()
    q_rope = torch.stack([r[-1] for _, r, _ in seqs]).cuda()
    args = (store.rows.cuda(), weight, store.slot_table.cuda(), torch.arange(3).cuda(), torch.tensor([39, 8, 16]).cuda(), SCALE)
    bound = REGISTRY.get("mla.triton", 1).bind({**BF16, **tuning.hopper_tile(20, 192, 64, 512, 256)})
    eager = bound(q_nope, q_rope, *args)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = bound(q_nope, q_rope, *args)
    graph.replay()
    assert bitwise_equal(captured, eager)
