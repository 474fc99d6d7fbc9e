"""gdn.core.triton: values against the float64 recurrence, bit for bit the same packed, in prefill chunks
cut anywhere and in decode from every offset of a chunk over a NaN-poisoned cache (also with several
blocks of value columns and at Qwen3.5's head sizes on a GPU); the Triton backward's gradients against
float64; the battery's admission; bad constants refused. Without a GPU the kernels run in Triton's
interpreter (tests/ops/linear/test_triton.py has why TRITON_INTERPRET must be set before `triton` is
imported), where bf16 is compared by tolerance only (the interpreter truncates fp32 -> bf16)."""

import functools
import os
import subprocess
import sys

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, bitwise_equal, int_view, preset_dict, require_triton

require_triton()

from isoexec.contract import Contract  # noqa: E402
from isoexec.ops.gdn import native as gdn_native  # noqa: E402
from isoexec.ops.gdn import reference  # noqa: E402
from isoexec.ops.gdn import triton as gdn_triton  # noqa: E402
from isoexec.ops.gdn import triton_bwd as gdn_triton_bwd  # noqa: E402
from isoexec.runtime.registry import REGISTRY  # noqa: E402
from isoexec.validate.battery import validate_entry  # noqa: E402

from . import test_core  # noqa: E402
from .test_core import HV, DK, DV, make_params, make_seq, textbook  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

C = 16  # tl.dot's smallest tile


def on_device(fn):
    """fn taking and returning CPU tensors, run on DEVICE (a cache already there is used in place)."""

    def op(**kwargs):
        return fn(**{k: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for k, t in kwargs.items()}).cpu()

    return op


CONSTANTS = dict(accum_dtype="float32", chunk_size=C, dot_precision="ieee", block_v=16, num_warps=4)


def triton_op(dtype=torch.float32, **changes):
    name = str(dtype).removeprefix("torch.")
    return on_device(functools.partial(gdn_triton.gdn_core, input_dtype=name, output_dtype=name, **{**CONSTANTS, **changes}))


class DeviceCache(test_core.Cache):
    """test_core's cache in this impl's layout (its rows: the open chunk's inputs) where the kernel runs, so
    that it writes the slots the next call reads; laid out for the constant `inverse` (its rows hold T's under "rows")."""

    inverse = "products"

    def __init__(self, slots=3):
        self.state = torch.full((slots, test_core.HV, test_core.DK, test_core.DV), float("nan"), device=DEVICE)
        width = gdn_triton.row_width(test_core.HV, test_core.DK, test_core.DV, dict(inverse=self.inverse))
        self.rows = torch.full((slots, test_core.C, test_core.HV, width), float("nan"), device=DEVICE)


def device_cache(inverse: str) -> type:
    return type(f"DeviceCache_{inverse}", (DeviceCache,), dict(inverse=inverse))


@pytest.fixture
def chunks_of_16(monkeypatch, request):
    """test_core's helpers (its Cache, packed and forms) with this file's chunk size, the cache on DEVICE, laid out for
    the test's `inverse` parameter where it has one."""
    monkeypatch.setattr(test_core, "C", C)
    callspec = getattr(request.node, "callspec", None)
    monkeypatch.setattr(test_core, "Cache", device_cache(callspec.params.get("inverse", "products") if callspec else "products"))


INVERSE = pytest.mark.parametrize("inverse", ["products", "rows"])


@INVERSE
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("min_run", [None, 1], ids=["one launch", "two launches"])
def test_rows_match_the_float64_recurrence(chunks_of_16, monkeypatch, dtype, tol, min_run, inverse):
    monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MIN_RUN", min_run)
    monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MAX_FILL", None)  # on a GPU too, however many programs the call has
    seqs, params = [make_seq(n, dtype, seed=n) for n in (1, C - 1, C, C + 1, 3 * C + 5)], make_params()
    for seq, out in zip(seqs, test_core.packed(triton_op(dtype, inverse=inverse), seqs, params)):
        want = textbook(seq, params)
        assert out.dtype == dtype and out.shape == want.shape
        assert (out.double() - want).abs().max() < tol * max(1.0, float(want.abs().max()))


@INVERSE
def test_every_form_gives_the_trainers_bits(chunks_of_16, inverse):
    """A sequence over two chunks, packed alone and after others, prefill at the chunk boundary, in chunks
    of 5, mid-chunk then decode, decode from every offset: one op sequence a row, so the same bits (fp32:
    the interpreter's bf16 is not the GPU's); with the inverse by rows, a decode step computes T's row alone from
    the rows the slot keeps. Control: native's decode differs from its packed rows."""
    results = dict(test_core.forms(triton_op(inverse=inverse), torch.float32, length=C + 5))
    first = results["alone"]
    differing = {form: int((int_view(out) != int_view(first)).sum()) for form, out in results.items() if not bitwise_equal(out, first)}
    assert not differing
    assert torch.isfinite(first).all()
    assert native_decode_differs(make_seq(C + 5, seed=5), make_params())


@pytest.mark.parametrize("precision, inverse", [("ieee", "products"), ("bf16", "products"), ("ieee", "rows"), ("bf16", "rows")],
                         ids=["fp32 products", "bf16 operands and buffers", "fp32 products, inverse by rows", "bf16, inverse by rows"])
def test_two_launches_give_one_launchs_bits_and_cache(chunks_of_16, monkeypatch, precision, inverse):
    """Four sequences packed (lengths 1 to 3C + 5) as a trainer call, and the same through a NaN-poisoned cache in
    calls of 11 tokens a sequence (pieces that start and end mid-chunk, close chunks, continue open ones), in
    one launch and in two (TWO_LAUNCH_MIN_RUN; the walk over the value columns in one block where the one launch
    takes two, WALK_BLOCK_V; its tiles loaded a piece ahead or not, WALK_PREFETCH): the same output bits, and the
    same state and open rows left in every slot after each call; with bf16 operands the walk's buffers are bf16
    (the prefetched walk alone: the loads are the same helper's either way). Control: native's token-by-token
    decode differs from its packed rows."""
    monkeypatch.setattr(test_core, "DV", 32)  # two blocks of 16 value columns in the one launch, one of 32 in the walk
    seqs, params = [make_seq(n, seed=n) for n in (3 * C + 5, 1, 2 * C, C + 9)], make_params()
    results = {}
    paths = ((None, None, False), (1, 32, False), (1, 32, True)) if precision == "ieee" else ((None, None, False), (1, 32, True))
    for min_run, walk_block, prefetch in paths:
        monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MIN_RUN", min_run)
        monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MAX_FILL", None)  # on a GPU too, however many programs the call has
        monkeypatch.setattr(gdn_triton, "WALK_BLOCK_V", walk_block)
        monkeypatch.setattr(gdn_triton, "WALK_PREFETCH", prefetch)
        op = triton_op(dot_precision=precision, inverse=inverse)
        trainer = torch.cat(test_core.packed(op, seqs, params))
        cache, outputs, caches = test_core.Cache(slots=len(seqs)), [], []
        for start in range(0, 3 * C + 5, 11):
            spans = [(slot, seq, start, min(start + 11, seq["q"].shape[0])) for slot, seq in enumerate(seqs) if start < seq["q"].shape[0]]
            outputs.extend(cache.step(op, params, spans))
            caches += [cache.state.cpu().clone(), cache.rows.cpu().clone()]
        results[prefetch if min_run else None] = (trainer, torch.cat(outputs), caches)
    trainer, engine, caches = results.pop(None)
    for trainer2, engine2, caches2 in results.values():
        assert bitwise_equal(trainer2, trainer) and bitwise_equal(engine2, engine)
        assert all(torch.equal(int_view(a), int_view(b)) for a, b in zip(caches, caches2))  # NaN where no call wrote
    assert torch.isfinite(trainer).all() and torch.isfinite(engine).all()
    assert native_decode_differs(seqs[0], params)


def native_decode_differs(seq, params) -> bool:
    """The control: native's token-by-token decode (the recurrent step) is another op sequence than its packed chunk
    form, so its decoded rows (finite) differ from its packed rows."""
    native_op = test_core.op("native")
    native_cache = test_core.Cache.__new__(test_core.Cache)
    native_cache.state = torch.full((1, HV, DK, test_core.DV), float("nan"))
    native_cache.rows = torch.full((1, C, HV, gdn_native.row_width(HV, DK, test_core.DV)), float("nan"))
    decoded = torch.cat([native_cache.step(native_op, params, [(0, seq, t, t + 1)])[0] for t in range(seq["q"].shape[0])])
    return bool(torch.isfinite(decoded).all()) and not bitwise_equal(decoded, test_core.packed(native_op, [seq], params)[0])


def test_the_cache_holds_the_open_chunks_inputs(chunks_of_16):
    """After a prefill of 2C + 3 tokens the slot holds S₀ after two chunks (close to the reference's) and the
    open chunk's three rows of inputs: k and v as given, g and β as gated; the rest stays poisoned."""
    seq, params = make_seq(2 * C + 3), make_params()
    cache, ref = test_core.Cache(), test_core.Cache()
    reference_op = functools.partial(reference.gdn_core, input_dtype="float32", output_dtype="float32", accum_dtype="float32", chunk_size=C,
                                     **test_core.REDUCE)
    cache.step(triton_op(), params, [(2, seq, 0, 2 * C + 3)])
    ref.rows = torch.full((3, C, HV, reference.row_width(HV, DK, DV)), float("nan"))
    ref.state = torch.full((3, HV, DK, DV), float("nan"))
    ref.step(reference_op, params, [(2, seq, 0, 2 * C + 3)])
    torch.testing.assert_close(cache.state[2].cpu(), ref.state[2], atol=1e-5, rtol=1e-5)
    rows = cache.rows[2].cpu()  # [C, HV, width]
    k_pad, v_pad = gdn_triton._padded(DK), gdn_triton._padded(DV)
    group = HV // seq["k"].shape[1]
    assert torch.equal(rows[:3, :, :DK], seq["k"][2 * C :].repeat_interleave(group, 1))
    assert torch.equal(rows[:3, :, k_pad : k_pad + DV], seq["v"][2 * C :])
    g, beta = reference.gates(seq["a"][2 * C :], seq["b"][2 * C :], params["a_log"], params["dt_bias"], torch.float32)
    torch.testing.assert_close(rows[:3, :, k_pad + v_pad], g, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rows[:3, :, k_pad + v_pad + 1], beta, atol=1e-6, rtol=1e-6)
    assert torch.isnan(rows[3:]).all() and torch.isnan(cache.state[:2].cpu()).all()


def test_the_slot_keeps_k_and_v_in_the_input_dtype(chunks_of_16):
    """bf16 inputs: the open chunk's k and v rows as given, in bf16 at the start of their fp32 fields (so that a row's
    value is one load, from the slot or from the call), each field's other half untouched."""
    seq, params = make_seq(C + 3, dtype=torch.bfloat16), make_params()
    cache = test_core.Cache()
    cache.step(triton_op(torch.bfloat16), params, [(2, seq, 0, C + 3)])
    rows = cache.rows[2].cpu()  # [C, HV, width] fp32
    k_pad, group = gdn_triton._padded(DK), HV // seq["k"].shape[1]
    halves = rows.view(torch.bfloat16)  # [C, HV, 2 width]
    assert torch.equal(halves[:3, :, :DK], seq["k"][C:].repeat_interleave(group, 1))
    assert torch.equal(halves[:3, :, 2 * k_pad : 2 * k_pad + DV], seq["v"][C:])
    assert torch.isnan(rows[:3, :, k_pad // 2 : k_pad]).all() and torch.isnan(rows[3:]).all()


def test_the_inverse_by_rows_keeps_t_rows_in_the_slot_and_moves_bits(chunks_of_16):
    """`inverse = "rows"`: after a prefill of 2C + 3 tokens the slot's T field holds the open chunk's three rows of
    (I + A)^-1 (lower triangular, ones on the diagonal, zeros past each row) and nothing else of that field is
    written; the rows are those of the product inverse's function (close) and not its bits (fp32 throughout: the two
    inverses round along other sequences), so the constant is a choice of arithmetic, not a no-op."""
    seq, params = make_seq(2 * C + 3), make_params()
    cache = device_cache("rows")()
    cache.step(triton_op(inverse="rows"), params, [(2, seq, 0, 2 * C + 3)])
    rows = cache.rows[2].cpu()
    t_field = gdn_triton._padded(DK) + gdn_triton._padded(DV) + 16
    t = rows[:3, :, t_field : t_field + C]  # [3, HV, C]
    assert torch.equal(t[:, :, :3].diagonal(dim1=0, dim2=2), torch.ones(HV, 3))
    assert (t[0, :, 1:] == 0).all() and (t[1, :, 2:] == 0).all() and (t[2, :, 3:] == 0).all() and (t[1:, :, 0] != 0).all()
    assert torch.isnan(rows[3:]).all() and torch.isnan(rows[:3, :, t_field + C :]).all()
    long = [make_seq(3 * C + 5, seed=seed) for seed in (9, 10, 11)]
    by_rows = torch.cat(test_core.packed(triton_op(inverse="rows"), long, params))
    by_products = torch.cat(test_core.packed(triton_op(), long, params))
    torch.testing.assert_close(by_rows, by_products, atol=1e-5, rtol=1e-5)
    assert (int_view(by_rows) != int_view(by_products)).sum() > 0  # 12 of 1,272 elements at seed 9 alone


def test_several_blocks_of_value_columns_give_the_same_rows(chunks_of_16, monkeypatch):
    """Value heads of 32 in blocks of 16 (two programs a head, each its own columns of the state): decoded token
    by token over a poisoned cache, bit for bit the packed rows (the other forms at Qwen3.5's head sizes on a
    GPU, with two blocks of 64); and the values of one block of 64."""
    monkeypatch.setattr(test_core, "DV", 32)
    seq, params = make_seq(C + 2, seed=3), make_params()
    packed = test_core.packed(triton_op(), [seq], params)[0]
    assert bitwise_equal(test_core.in_pieces(triton_op(), seq, params, range(1, C + 2)), packed)
    one_block = test_core.packed(triton_op(block_v=64), [seq], params)[0]
    torch.testing.assert_close(one_block, packed, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("inverse", ["products", "rows"])
def test_value_columns_split_over_the_grid_give_the_same_bits(chunks_of_16, monkeypatch, inverse):
    """Value heads of 32 in the contract's one block, calls of one-token runs split over the grid in blocks of 16
    (SPLIT_BLOCK_V): calls cut anywhere give the unsplit calls' rows and leave the cache as they do, also with the
    runs unknown to the host (a captured CUDA graph: every call split, a run longer than a token walked by one
    program, block after block); decoded from every offset, the packed rows bit for bit. Control: native's decode
    differs from its packed rows."""
    monkeypatch.setattr(test_core, "DV", 32)
    op = triton_op(block_v=32, inverse=inverse)
    seq, params, cuts = make_seq(2 * C + 3, seed=3), make_params(), [3, 4, 5, C + 2, C + 3]

    def in_pieces(split, captured=False):
        cache = device_cache(inverse)()
        with monkeypatch.context() as m:
            m.setattr(gdn_triton, "SPLIT_BLOCK_V", split)
            m.setattr(test_core, "Cache", lambda: cache)
            if captured:
                m.setattr(gdn_triton, "find_runs", lambda positions, state_ids: None)
            return test_core.in_pieces(op, seq, params, cuts), cache

    unsplit = in_pieces(None)
    for split in (in_pieces(16), in_pieces(16, captured=True)):
        assert bitwise_equal(split[0], unsplit[0])
        assert bitwise_equal(split[1].state.cpu(), unsplit[1].state.cpu()) and bitwise_equal(split[1].rows.cpu(), unsplit[1].rows.cpu())
    monkeypatch.setattr(gdn_triton, "SPLIT_BLOCK_V", 16)
    assert bitwise_equal(test_core.in_pieces(op, seq, params, range(1, 2 * C + 3)), test_core.packed(op, [seq], params)[0])
    assert native_decode_differs(seq, params)


def test_gate_constants_of_mixed_dtypes_are_read_as_their_values(chunks_of_16, monkeypatch):
    """A_log in fp32 beside a bf16 dt_bias (checkpoints may keep A_log in fp32): the rows of the same values in fp32,
    bit for bit, in one-token runs split over the grid (the one-token program reads the pair through one load, so a
    mixed pair is promoted first) and in longer runs. Control: the fp32 dt_bias before its bf16 rounding (other values
    by construction) gives other rows, so the comparison sees the gate constants."""
    monkeypatch.setattr(test_core, "DV", 32)
    monkeypatch.setattr(gdn_triton, "SPLIT_BLOCK_V", 16)
    op, params = triton_op(block_v=32), make_params()
    mixed = dict(a_log=params["a_log"], dt_bias=params["dt_bias"].bfloat16())
    promoted = dict(a_log=params["a_log"], dt_bias=mixed["dt_bias"].float())
    for lengths in ((1, 1, 1), (3, C + 2)):
        seqs = [make_seq(n, seed=n) for n in lengths]
        for got, want in zip(test_core.packed(op, seqs, mixed), test_core.packed(op, seqs, promoted)):
            assert bitwise_equal(got, want)
    assert not torch.equal(params["dt_bias"], promoted["dt_bias"])
    unrounded = torch.cat(test_core.packed(op, seqs, params))
    assert not bitwise_equal(unrounded, torch.cat(test_core.packed(op, seqs, promoted)))


def test_the_split_rule_is_read_from_the_environment(monkeypatch):
    for value in ("32:0.5,64:4", "64:4,32:0.5"):  # narrowest block first, whatever the order given
        monkeypatch.setenv("ISOEXEC_GDN_SPLITS", value)
        assert gdn_triton._env_splits("ISOEXEC_GDN_SPLITS", ()) == ((32, 0.5), (64, 4.0))
    monkeypatch.setenv("ISOEXEC_GDN_SPLITS", "off")
    assert gdn_triton._env_splits("ISOEXEC_GDN_SPLITS", ((32, 1.0),)) == ()
    for bad in ("48:1", "32", "32:0", "32:x"):
        monkeypatch.setenv("ISOEXEC_GDN_SPLITS", bad)
        with pytest.raises(ValueError, match="ISOEXEC_GDN_SPLITS must be"):
            gdn_triton._env_splits("ISOEXEC_GDN_SPLITS", ())


def test_the_path_choice_reads_its_knobs_from_the_environment(monkeypatch):
    """The two-launch path's run length and fill (triton.py): a number, `off`, or a one-line refusal; off a GPU the run
    length alone decides, and with no fill bound (the default) a GPU decides the same way."""
    monkeypatch.delenv("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", raising=False)
    assert gdn_triton._env_int("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", 2048, least=1) == 2048
    for value, parsed in (("512", 512), ("off", None)):
        monkeypatch.setenv("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", value)
        assert gdn_triton._env_int("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", 2048, least=1) == parsed
    for bad in ("0", "-4", "2k"):
        monkeypatch.setenv("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", bad)
        with pytest.raises(ValueError, match=r"ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN must be a whole number >= 1 or 'off'"):
            gdn_triton._env_int("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", 2048, least=1)
    monkeypatch.delenv("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", raising=False)
    assert gdn_triton._env_fill("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", None) is None
    for value, parsed in (("0.5", 0.5), ("off", None)):
        monkeypatch.setenv("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", value)
        assert gdn_triton._env_fill("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", None) == parsed
    for bad in ("0", "-1", "half"):
        monkeypatch.setenv("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", bad)
        with pytest.raises(ValueError, match="ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL must be a positive number or 'off'"):
            gdn_triton._env_fill("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", None)
    cpu = torch.device("cpu")
    monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MIN_RUN", 64)
    for fill in (None, 0.5):  # a fill bound counts SMs: a GPU's alone
        monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MAX_FILL", fill)
        assert gdn_triton._in_two_launches(128, 2, 32, cpu) and not gdn_triton._in_two_launches(127, 2, 32, cpu)
    monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MIN_RUN", None)
    assert not gdn_triton._in_two_launches(1 << 20, 1, 1, cpu)


def test_the_walk_narrows_where_its_programs_would_leave_sms_idle(monkeypatch):
    """WALK_NARROW's rule (triton.py): 32 columns where the walk at 64 would have at most one program an SM (a
    one-run prefill, 2 x 4096 tokens at 16 value heads), 64 where it fills the GPU (8 x 2048); off a GPU, with the rule
    off, or with WALK_BLOCK_V at the narrow block already, WALK_BLOCK_V; the knob read as SPLITS is."""
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(gdn_triton, "_num_sms", lambda device: 132)
    monkeypatch.setattr(gdn_triton, "WALK_BLOCK_V", 64)
    monkeypatch.setattr(gdn_triton, "WALK_NARROW", ((32, 1.0),))
    assert [gdn_triton._walk_block(runs, heads, 128, gpu) for runs, heads in ((1, 32), (2, 16), (2, 32), (3, 32), (8, 16))] == [32, 32, 32, 64, 64]
    assert gdn_triton._walk_block(1, 32, 128, cpu) == 64
    monkeypatch.setattr(gdn_triton, "WALK_NARROW", ())
    assert gdn_triton._walk_block(1, 32, 128, gpu) == 64
    monkeypatch.setattr(gdn_triton, "WALK_NARROW", ((32, 1.0),))
    monkeypatch.setattr(gdn_triton, "WALK_BLOCK_V", 32)
    assert gdn_triton._walk_block(1, 32, 128, gpu) == 32
    monkeypatch.setattr(gdn_triton, "WALK_BLOCK_V", None)
    assert gdn_triton._walk_block(1, 32, 128, gpu) is None
    monkeypatch.setenv("ISOEXEC_GDN_WALK_NARROW", "16:0.5,32:1")
    assert gdn_triton._env_splits("ISOEXEC_GDN_WALK_NARROW", ()) == ((16, 0.5), (32, 1.0))
    monkeypatch.setenv("ISOEXEC_GDN_WALK_NARROW", "24:1")
    with pytest.raises(ValueError, match="ISOEXEC_GDN_WALK_NARROW must be `off` or blocks:programs-an-SM pairs"):
        gdn_triton._env_splits("ISOEXEC_GDN_WALK_NARROW", ())


@pytest.mark.skipif(not ON_GPU, reason="the contract's tile at Qwen3.5's head sizes: compiled for the GPU (the interpreter takes minutes)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("chunk, block_v, num_warps", [(16, 128, 4), (32, 128, 8), (64, 64, 8)], ids=["contract", "chunks of 32", "chunks of 64"])
@pytest.mark.parametrize("min_run, walk_block, prefetch, split", [(None, None, False, None), (2, None, False, None), (2, 32, True, None),
                                                                   (None, None, False, 32)],
                         ids=["one launch", "runs of two tokens or more in two launches", "two launches, a walk of 32 columns, prefetched",
                              "one launch, the value columns split over the grid in 32"])
@INVERSE
def test_at_qwen_head_sizes_every_form_gives_the_trainers_bits(monkeypatch, dtype, chunk, block_v, num_warps, min_run, walk_block, prefetch,
                                                                split, inverse):
    """Heads of 128 and bf16 tensor-core products (tiny-hybrid-triton's constants, and chunks of 32 and 64): a
    sequence over three chunks packed, in prefill chunks and decoded from every offset, bit for bit (every
    call in one launch, or the calls of runs longer than a token in two, beside the decode steps' one, the
    walk in the contract's blocks of value columns or narrower, its tiles loaded a piece ahead); close to
    float64."""
    monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MIN_RUN", min_run)
    monkeypatch.setattr(gdn_triton, "TWO_LAUNCH_MAX_FILL", None)  # on a GPU too, however many programs the call has
    monkeypatch.setattr(gdn_triton, "WALK_BLOCK_V", walk_block)
    monkeypatch.setattr(gdn_triton, "WALK_PREFETCH", prefetch)
    monkeypatch.setattr(gdn_triton, "SPLITS", ())  # unsplit, or every call of one-token runs split in `split`
    monkeypatch.setattr(gdn_triton, "SPLIT_BLOCK_V", split)
    monkeypatch.setattr(test_core, "C", chunk)
    monkeypatch.setattr(test_core, "DK", 128)
    monkeypatch.setattr(test_core, "DV", 128)
    monkeypatch.setattr(test_core, "Cache", device_cache(inverse))
    op = triton_op(dtype, chunk_size=chunk, dot_precision="bf16", block_v=block_v, num_warps=num_warps, inverse=inverse)
    results = dict(test_core.forms(op, dtype, length=2 * chunk + 37))
    first = results["alone"]
    if split is not None:  # against the rows of the contract's one block of value columns
        monkeypatch.setattr(gdn_triton, "SPLIT_BLOCK_V", None)
        first = test_core.packed(op, [make_seq(2 * chunk + 37, dtype, seed=3)], make_params())[0]
    differing = {form: int((int_view(out) != int_view(first)).sum()) for form, out in results.items() if not bitwise_equal(out, first)}
    assert not differing
    seq, params = make_seq(2 * chunk + 37, dtype, seed=3), make_params()
    want = textbook(seq, params)
    assert (first.double() - want).abs().max() < 3e-2 * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("v_dim, block_v, walk_block, bwd_chunk, split, walk_inputs, walk_stages",
                         [(6, 64, None, 16, False, False, 0), (48, 16, None, 16, False, False, 0), (48, 32, None, 32, True, False, 0),
                          (48, 32, 16, 32, True, False, 0), (48, 16, None, 32, True, True, 0), (48, 32, None, 16, True, True, 2)],
                         ids=["one value block", "three value blocks", "backward chunks of 32, split", "walks in narrower blocks",
                              "walk inputs from buffers", "walks in a for loop"])
def test_gradients_match_float64_autograd_of_the_recurrence(chunks_of_16, monkeypatch, v_dim, block_v, walk_block, bwd_chunk, split,
                                                            walk_inputs, walk_stages):
    """The Triton backward (T, W and U per chunk, the walks for the chunk-start states and each chunk's dS',
    the chunks' gradients, the norms' and gates' backward): every input's gradient, A_log's and dt_bias' too,
    over four packed sequences (a partial last chunk, one of 1 token, one of exactly two forward chunks, one
    of several), value heads sharing key heads, in one to three blocks of value columns, the walks in the chunk
    kernels' blocks or narrower ones (WALK_BLOCK_V), their column-free inputs computed in the walks or loaded
    (WALK_INPUTS), their chunks in a `while` or a `for` (WALK_STAGES), in backward chunks as long as the forward's and longer, the chunks' gradients in one kernel or
    two (SPLIT), against float64 autograd of the recurrence."""
    monkeypatch.setattr(test_core, "DV", v_dim)
    monkeypatch.setattr(gdn_triton_bwd, "BLOCK_V", block_v)
    monkeypatch.setattr(gdn_triton_bwd, "WALK_BLOCK_V", walk_block)
    monkeypatch.setattr(gdn_triton_bwd, "WALK_INPUTS", walk_inputs)
    monkeypatch.setattr(gdn_triton_bwd, "WALK_STAGES", walk_stages)
    monkeypatch.setattr(gdn_triton_bwd, "CHUNK", bwd_chunk)
    monkeypatch.setattr(gdn_triton_bwd, "SPLIT", split)
    _gradients_against_float64(triton_op(block_v=block_v), (C + 5, 1, 2 * C, 4 * C + 3), atol=2e-5, rtol=1e-4)


_WALKS_REFUSED = "ISOEXEC_GDN_BWD_WALKS must be 'one' or 'two', got '2'"
_BLOCK_REFUSED = "ISOEXEC_GDN_BWD_WALK_BLOCK_V must be a power of two >= 16, got '{}'"
_INPUTS_REFUSED = "ISOEXEC_GDN_BWD_WALK_INPUTS must be 0 or 1, got 'on'"
_STAGES_REFUSED = "ISOEXEC_GDN_BWD_WALK_STAGES must be 0 or a whole number >= 2, got '{}'"


@pytest.mark.parametrize("variable, attribute, value, expected", [
    ("ISOEXEC_GDN_BWD_WALKS", "ONE_WALK_LAUNCH", "", "True"), ("ISOEXEC_GDN_BWD_WALKS", "ONE_WALK_LAUNCH", "one", "True"),
    ("ISOEXEC_GDN_BWD_WALKS", "ONE_WALK_LAUNCH", "two", "False"), ("ISOEXEC_GDN_BWD_WALKS", "ONE_WALK_LAUNCH", "2", _WALKS_REFUSED),
    ("ISOEXEC_GDN_BWD_WALK_BLOCK_V", "WALK_BLOCK_V", "", "None"), ("ISOEXEC_GDN_BWD_WALK_BLOCK_V", "WALK_BLOCK_V", "32", "32"),
    *(("ISOEXEC_GDN_BWD_WALK_BLOCK_V", "WALK_BLOCK_V", bad, _BLOCK_REFUSED.format(bad)) for bad in ("24", "8", "off")),
    ("ISOEXEC_GDN_BWD_WALK_INPUTS", "WALK_INPUTS", "", "False"), ("ISOEXEC_GDN_BWD_WALK_INPUTS", "WALK_INPUTS", "1", "True"),
    ("ISOEXEC_GDN_BWD_WALK_INPUTS", "WALK_INPUTS", "0", "False"), ("ISOEXEC_GDN_BWD_WALK_INPUTS", "WALK_INPUTS", "on", _INPUTS_REFUSED),
    ("ISOEXEC_GDN_BWD_WALK_STAGES", "WALK_STAGES", "", "0"), ("ISOEXEC_GDN_BWD_WALK_STAGES", "WALK_STAGES", "3", "3"),
    *(("ISOEXEC_GDN_BWD_WALK_STAGES", "WALK_STAGES", bad, _STAGES_REFUSED.format(bad)) for bad in ("1", "-2", "two")),
])
def test_the_backward_knobs_are_read_from_the_environment(variable, attribute, value, expected):
    """The backward's knobs: the walks in one launch or two (`one`, the default), the walks' block (unset: the chunk
    kernels'; a power of two >= 16), their inputs loaded (1) or computed (0, the default), their loop a `while` (0,
    the default) or a `for` pipelined n - 1 chunks ahead (n >= 2); anything else, a one-line refusal at import."""
    env = {k: v for k, v in os.environ.items() if k != variable} | {variable: value}
    result = subprocess.run([sys.executable, "-c", f"from isoexec.ops.gdn import triton_bwd; print(triton_bwd.{attribute})"],
                            capture_output=True, text=True, env=env, timeout=120)
    if expected.startswith("ISOEXEC_"):
        assert result.returncode != 0 and expected in result.stderr.splitlines()[-1]
    else:
        assert result.returncode == 0 and result.stdout.strip() == expected, result.stderr[-2000:]


def _packed_gradients(op, seqs, params) -> dict:
    """Every input's gradient (a sequence's as `name[i]`) of a fixed weighted sum of op's packed outputs."""
    leaves = [{n: t.clone().requires_grad_() for n, t in seq.items()} for seq in seqs]
    p32 = {n: t.clone().requires_grad_() for n, t in params.items()}
    outs = test_core.packed(op, leaves, p32)
    sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs).backward()
    return {f"{n}[{i}]": t.grad for i, leaf in enumerate(leaves) for n, t in leaf.items()} | {n: t.grad for n, t in p32.items()}


def test_bf16_buffers_round_as_the_operands_do(chunks_of_16, monkeypatch):
    """With bf16 operands the backward stores T, W, the states, δ, dS', dδ and dW as bf16: the gradients that
    reach them only as operands (q, k, v, b) keep their bits exactly, and those through Σ S ∘ dS' (a, A_log,
    dt_bias) move by little; the control, fp32 operands, changes q's gradient."""
    monkeypatch.setattr(test_core, "DV", 48)
    monkeypatch.setattr(gdn_triton_bwd, "BLOCK_V", 32)
    monkeypatch.setattr(gdn_triton_bwd, "CHUNK", 32)
    seqs, params = [make_seq(n, seed=n) for n in (C + 5, 1, 2 * C + 3)], make_params()  # 2 C + 3: two backward chunks of 32, the last partial

    def gradients(precision, bf16_buffers):
        monkeypatch.setattr(gdn_triton_bwd, "BF16_BUFFERS", bf16_buffers)
        return _packed_gradients(triton_op(block_v=32, dot_precision=precision), seqs, params)

    stored, kept = gradients("bf16", True), gradients("bf16", False)
    for name, got in stored.items():
        if name[0] in "qkvb":
            assert bitwise_equal(got, kept[name]), name
        else:
            torch.testing.assert_close(got, kept[name], rtol=1e-2, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert not bitwise_equal(gradients("ieee", False)["q[0]"], kept["q[0]"])


@pytest.mark.parametrize("knob, on, off, fixed", [
    ("ONE_WALK_LAUNCH", True, False, dict(BF16_BUFFERS=True)), ("ONE_WALK_LAUNCH", True, False, dict(BF16_BUFFERS=False)),
    ("WALK_INPUTS", True, False, dict(ONE_WALK_LAUNCH=True)), ("WALK_INPUTS", True, False, dict(ONE_WALK_LAUNCH=False)),
    ("WALK_STAGES", 2, 0, dict(ONE_WALK_LAUNCH=True)), ("WALK_STAGES", 3, 0, dict(ONE_WALK_LAUNCH=False, WALK_INPUTS=True)),
], ids=["walks in one launch, bf16 buffers", "walks in one launch, fp32 buffers (δ over U)", "walk inputs loaded, one launch",
        "walk inputs loaded, two launches", "walks in a for loop, one launch", "walks in a for loop, two launches, inputs loaded"])
def test_the_walks_knobs_keep_every_gradients_bits(chunks_of_16, monkeypatch, knob, on, off, fixed):
    """Knobs of the walks that must not move a bit, on against off, in the interpreter: both walks in one launch
    (ONE_WALK_LAUNCH: the forward walk's programs first, the reverse walk's after them, the two launches' programs),
    the walks' column-free inputs computed for every chunk at once and loaded (WALK_INPUTS: the values the walks
    computed, rounded as their operands are), and the walks' chunks in a `for` (WALK_STAGES: the reverse walk's
    index counted down from the run's last chunk; the interpreter does not pipeline it). Every gradient keeps its
    bits over three blocks of value columns, two value heads a key head and runs of one to several backward
    chunks; the control, fp32 products, moves q's gradient, so the comparison sees a change."""
    monkeypatch.setattr(test_core, "DV", 48)
    monkeypatch.setattr(gdn_triton_bwd, "BLOCK_V", 16)
    monkeypatch.setattr(gdn_triton_bwd, "CHUNK", 16)
    for name, value in fixed.items():
        monkeypatch.setattr(gdn_triton_bwd, name, value)
    seqs, params = [make_seq(n, seed=n) for n in (C + 5, 1, 3 * C + 3)], make_params()

    def gradients(value, precision="bf16"):
        monkeypatch.setattr(gdn_triton_bwd, knob, value)
        return _packed_gradients(triton_op(block_v=16, dot_precision=precision), seqs, params)

    with_knob, without = gradients(on), gradients(off)
    assert [name for name, got in with_knob.items() if not bitwise_equal(got, without[name])] == []
    assert not bitwise_equal(gradients(on, "ieee")["q[0]"], with_knob["q[0]"])


@pytest.mark.skipif(not ON_GPU, reason="the backward's own tiles at Qwen3.5's head sizes: compiled for the GPU")
@pytest.mark.parametrize("walks", [{}, dict(WALK_INPUTS=True, WALK_STAGES=2)], ids=["the code's walks", "walks pipelined, inputs loaded"])
@pytest.mark.parametrize("precision, atol, rtol, norm", [("ieee", 1e-4, 1e-4, None), ("bf16", None, None, 2e-2)])
def test_at_qwen_head_sizes_gradients_match_float64(chunks_of_16, monkeypatch, precision, atol, rtol, norm, walks):
    """Heads of 128 and the backward's own chunks and value blocks (as a trainer step runs it), the products
    in fp32 and as the contract's bf16 operands, the walks as the code takes them and pipelined (a loop only a
    GPU pipelines) with their inputs loaded: gradients over sequences of several backward chunks, one ending
    mid-chunk, against float64 autograd of the recurrence (with bf16 operands: each gradient within 2% of the
    float64 one's norm)."""
    for name, value in walks.items():
        monkeypatch.setattr(gdn_triton_bwd, name, value)
    monkeypatch.setattr(test_core, "DK", 128)
    monkeypatch.setattr(test_core, "DV", 128)
    chunk = gdn_triton_bwd.CHUNK
    _gradients_against_float64(triton_op(dot_precision=precision, block_v=128), (3 * chunk + 11, 2 * chunk), atol=atol, rtol=rtol,
                               norm=norm)


def _gradients_against_float64(op, lengths, atol, rtol, norm=None):
    """Every input's and parameter's gradient of `op` over packed sequences of `lengths` (a weighted sum of
    the outputs), against float64 autograd of the token-by-token recurrence: elementwise within atol and
    rtol, or (norm) the difference's norm within that fraction of the float64 gradient's."""
    seqs, params = [make_seq(n, seed=n) for n in lengths], make_params()
    leaves = [{n: t.clone().requires_grad_() for n, t in seq.items()} for seq in seqs]
    p32 = {n: t.clone().requires_grad_() for n, t in params.items()}
    outs = test_core.packed(op, leaves, p32)
    weights = [torch.linspace(-1, 1, o.numel()).view_as(o) * (i + 1) for i, o in enumerate(outs)]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    exact = [{n: t.detach().double().requires_grad_() for n, t in seq.items()} for seq in seqs]
    p64 = {n: t.detach().double().requires_grad_() for n, t in params.items()}
    sum((textbook(e, p64) * w.double()).sum() for e, w in zip(exact, weights)).backward()
    pairs = [(f"{name}[{i}]", got[name].grad, want[name].grad) for i, (got, want) in enumerate(zip(leaves, exact)) for name in got]
    for name, got, want in pairs + [(name, p32[name].grad, p64[name].grad) for name in p32]:
        if norm is None:
            torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")
        else:
            assert float((got.double() - want).norm()) <= norm * float(want.norm()), name


@pytest.mark.parametrize("change, message", [
    (dict(positions=torch.tensor([0, 1, 5])), "gdn.core: without a cache every run starts at position 0, one starts at 5"),
    (dict(state_ids=torch.tensor([0, 0, 2])), "gdn.core: a state id lies outside the cache's 2 slots"),
], ids=["a run from position 5 without a cache", "a slot past the cache"])
def test_bad_values_are_refused_from_the_hosts_copy_of_the_runs(change, message):
    """check_inputs' value checks, read from gdn/runs.py's host copy instead of the tensors."""
    args = {**make_seq(3), **make_params(), "positions": torch.arange(3)}
    if "state_ids" in change:
        args.update(state=torch.zeros(2, HV, DK, DV), rows=torch.zeros(2, C, HV, gdn_triton.row_width(HV, DK, DV, CONSTANTS)))
    with pytest.raises(ValueError, match="^" + message):
        triton_op()(**{**args, **change})


def test_the_rows_layout_follows_the_inverse_and_a_cache_of_the_other_is_refused():
    """The slot rows carry T's 64-float field under `inverse = "rows"` alone, so a products contract's cache is that much
    narrower; a cache laid out for the other inverse is refused by its shape before any kernel reads it."""
    products, rows = (gdn_triton.row_width(HV, DK, DV, dict(inverse=inverse)) for inverse in ("products", "rows"))
    assert rows - products == 64 and products == gdn_triton._padded(DK) + gdn_triton._padded(DV) + 16
    assert gdn_triton.row_width(HV, DK, DV, {}) == products  # the constant's default
    args = {**make_seq(3), **make_params(), "positions": torch.arange(3), "state_ids": torch.zeros(3, dtype=torch.int64),
            "state": torch.zeros(1, HV, DK, DV), "rows": torch.zeros(1, C, HV, rows)}
    with pytest.raises(ValueError, match=rf"^gdn.core: rows must be float32 \[N, {C}, {HV}, {products}\]"):
        triton_op()(**args)


def test_the_battery_admits_it():
    """In the interpreter, the probe's forms and hazards at two short sequences (C + 1 and 5 carry its
    hazards; the interpreter runs every program of the (token, head) grid in numpy), fp32 only; on a GPU
    the full probe in both dtype passes."""
    data = preset_dict("tiny-dense")
    data["composition"].append({"region": "gdn.core", "ops": ["gdn_core"], "cases": ["trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"],
                                "impl": {"id": "gdn.core.triton", "version": gdn_triton.VERSION},
                                "constants": dict(input_dtype="bfloat16", output_dtype="bfloat16", **CONSTANTS),
                                "discharge": {"method": "bitwise_equal_to", "case": "trainer_fwd"}})
    contract = Contract.from_dict(data)
    probe = REGISTRY.probe("gdn.core") if ON_GPU else functools.partial(REGISTRY.probe("gdn.core"), lengths=(C + 1, 5))
    dtypes = ("bfloat16", "float32") if ON_GPU else ("float32",)  # the interpreter's bf16 is not the GPU's
    result = validate_entry(contract, contract.entry("gdn.core", "trainer_fwd"), probe, registry=REGISTRY, device=DEVICE, dtypes=dtypes)
    assert result.status == "admitted", result.failures[:5]


@pytest.mark.parametrize("changes, message", [
    (dict(accum_dtype="float64"), "accumulates in float32 only"),
    (dict(chunk_size=8), "chunk_size must be 16, 32 or 64"),
    (dict(chunk_size=128), "chunk_size must be 16, 32 or 64"),
    (dict(dot_precision="fp16"), "dot_precision must be one of"),
    (dict(inverse="solve"), "inverse must be one of"),
    (dict(block_v=24), "block_v must be a power of two"),
    (dict(chunk_size=64, block_v=32), "chunk_size 64 needs block_v >= 64"),
    (dict(num_warps=3), "num_warps must be a power of two"),
])
def test_bad_constants_are_refused(changes, message):
    constants = {**dict(input_dtype="float32", output_dtype="float32"), **CONSTANTS, **changes}
    with pytest.raises(ValueError, match=message):
        gdn_triton.check_constants(constants)
