"""attention.triton: correctness against float64, bitwise invariance across training, prefill chunks and
decode (the attention battery), its device-side tiling, and that batch-dependent variants are caught
by the same checks.

Without a GPU the kernel runs in Triton's interpreter (see tests/ops/linear/test_triton.py for why
TRITON_INTERPRET must be set before `triton` is imported), so the battery runs a reduced probe there;
on a GPU it runs the family's full probe.
"""

import dataclasses
import functools

import pytest
import torch

from conftest import BATTERY_DTYPES, DEVICE, INTERPRETER_WARNINGS, ON_GPU, bitwise_equal, int_view, randn, require_triton

require_triton()

from controls import CONTROLS  # noqa: E402
from isoexec.contract import load_preset  # noqa: E402
from isoexec.contract.schema import ImplRef  # noqa: E402
from isoexec.ops.attention import packed_slot_table, paged_slot_table, probe  # noqa: E402
from isoexec.ops.attention import triton as attention_triton  # noqa: E402
from isoexec.runtime.registry import REGISTRY, Impl, Registry  # noqa: E402
from isoexec.validate.battery import validate_entry  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

CONSTANTS = dict(input_dtype="float32", output_dtype="float32", kv_cache_dtype="float32", accum_dtype="float32", block_m=8,
                 block_n=16, num_warps=4, num_stages=1, split_kv_size=0)
BF16 = {**CONSTANTS, "input_dtype": "bfloat16", "output_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}


def attention(*args, constants=CONSTANTS, **kwargs):
    return attention_triton.attention(*args, **kwargs, **constants)


def float64_attention(q, k_store, v_store, slot_table, seq_ids, positions, scale, window=None):
    """Row by row in float64: softmax over the row's visible keys."""
    group = q.shape[1] // k_store.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        p = int(positions[t])
        keys = [j for j in range(min(p + 1, slot_table.shape[1])) if window is None or j > p - window]
        if not keys:
            continue
        slots = slot_table[seq_ids[t], keys].cpu()
        k = k_store.cpu().double()[slots].repeat_interleave(group, dim=1)  # [n, H, D]
        v = v_store.cpu().double()[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[t].cpu().double(), k) * scale
        out[t] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
    return out


def packed(lengths, heads=4, kv_heads=2, head_dim=16, seed=0, dtype=torch.float32):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE)
    slot_table, seq_ids, positions = packed_slot_table(cu)
    t = sum(lengths)
    q, k, v = (randn(t, h, head_dim, seed=seed + i, dtype=dtype) for i, h in enumerate((heads, kv_heads, kv_heads)))
    return q, k, v, slot_table, seq_ids, positions


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (6, 2)])
def test_packed_matches_float64(window, heads, kv_heads):
    q, k, v, slot_table, seq_ids, positions = packed([37, 1, 20], heads, kv_heads)
    out = attention(q, k, v, slot_table, seq_ids, positions, 0.25, window)
    expected = float64_attention(q, k, v, slot_table, seq_ids, positions, 0.25, window)
    assert (out.cpu().double() - expected).abs().max() < 1e-5


def test_paged_cache_with_poisoned_slots_matches_float64():
    """Decode rows over a shuffled paged cache whose unwritten slots hold NaN, inf and -inf."""
    page, lengths = 16, [33, 5, 16]
    pages = torch.randperm(8, generator=torch.Generator().manual_seed(1))
    block_table = torch.tensor([pages[0:3].tolist(), [pages[3].item(), -1, -1], [pages[4].item(), -1, -1]])
    slot_table = paged_slot_table(block_table, page, 3 * page).to(DEVICE)
    store = torch.tensor([float("nan"), float("inf"), float("-inf")]).repeat(8 * page * 2 * 16 // 3 + 1)[: 8 * page * 2 * 16]
    k_store, v_store = store.reshape(8 * page, 2, 16).to(DEVICE), store.reshape(8 * page, 2, 16).clone().to(DEVICE)
    for b, n in enumerate(lengths):
        k_store[slot_table[b, :n]] = randn(n, 2, 16, seed=10 + b)
        v_store[slot_table[b, :n]] = randn(n, 2, 16, seed=20 + b)
    q = randn(3, 4, 16, seed=3)
    seq_ids, positions = torch.arange(3, device=DEVICE), torch.tensor(lengths, device=DEVICE) - 1
    out = attention(q, k_store, v_store, slot_table, seq_ids, positions, 0.25)
    assert torch.isfinite(out).all()
    assert (out.cpu().double() - float64_attention(q, k_store, v_store, slot_table, seq_ids, positions, 0.25)).abs().max() < 1e-5


def _chunked_prefill(op, page, chunk, dtype):
    """Two prompts (37 and 20 tokens) prefilled by `op` in chunks of `chunk` tokens over shuffled pages of
    `page` slots -> per prompt (its chunked rows, its rows from one call, its rows in the packed batch)."""
    lengths, heads, kv_heads = (37, 20), 4, 2
    pages_per_seq = [-(-n // page) for n in lengths]
    order = torch.randperm(sum(pages_per_seq), generator=torch.Generator().manual_seed(2)).tolist()
    block_table = torch.full((2, max(pages_per_seq)), -1)
    block_table[0, : pages_per_seq[0]] = torch.tensor(order[: pages_per_seq[0]])
    block_table[1, : pages_per_seq[1]] = torch.tensor(order[pages_per_seq[0] :])
    slot_table = paged_slot_table(block_table, page, max(lengths)).to(DEVICE)
    q, k, v, packed_table, packed_ids, packed_positions = packed(lengths, heads, kv_heads, dtype=dtype)
    k_store = torch.full((sum(pages_per_seq) * page, kv_heads, 16), float("nan"), dtype=dtype, device=DEVICE)
    v_store = k_store.clone()
    trainer = op(q, k, v, packed_table, packed_ids, packed_positions, 0.25, None, max(lengths))
    starts = [0, lengths[0]]
    rows = {b: [] for b in range(2)}
    for lo in range(0, max(lengths), chunk):
        spans = [(b, lo, min(lo + chunk, n)) for b, n in enumerate(lengths) if lo < n]
        for b, a, z in spans:
            k_store[slot_table[b, a:z]], v_store[slot_table[b, a:z]] = k[starts[b] + a : starts[b] + z], v[starts[b] + a : starts[b] + z]
        step_q = torch.cat([q[starts[b] + a : starts[b] + z] for b, a, z in spans])
        seq_ids = torch.cat([torch.full((z - a,), b) for b, a, z in spans]).to(DEVICE)
        positions = torch.cat([torch.arange(a, z) for b, a, z in spans]).to(DEVICE)
        out = op(step_q, k_store, v_store, slot_table, seq_ids, positions, 0.25)
        for (b, a, z), part in zip(spans, out.split([z - a for _, a, z in spans])):
            rows[b].append(part)
    for b, n in enumerate(lengths):
        whole = op(q[starts[b] : starts[b] + n], k_store, v_store, slot_table, torch.full((n,), b, device=DEVICE),
                   torch.arange(n, device=DEVICE), 0.25)
        yield torch.cat(rows[b]), whole, trainer[starts[b] : starts[b] + n]


@pytest.mark.parametrize("page, chunk", [(16, 7), (4, 5), (8, 13)])
def test_prefill_chunks_cut_at_any_token_give_the_rows_of_one_call(page, chunk):
    """An engine may end a prefill chunk wherever its token budget does (vLLM does): chunks of 7, 5 or
    13 tokens start inside the 16-key blocks, over pages of 16, 4 or 8 slots, and every row is bitwise
    the row of the whole prompt in one call, and of the trainer's packed batch. The control (key blocks
    twice as wide for calls of more than `chunk` queries, `controls.key_block_attention`) differs."""
    op = functools.partial(attention, constants=BF16)
    for chunked, whole, trainer in _chunked_prefill(op, page, chunk, torch.bfloat16):
        assert bitwise_equal(chunked, whole) and bitwise_equal(whole, trainer)
    control = CONTROLS["attention"].bind(dict(input_dtype="float32", output_dtype="float32", kv_cache_dtype="float32",
                                              accum_dtype="float32", block_n=16, reduce_block=16, block_tree="balanced_binary",
                                              split_kv_size=0, small_rows=2 * chunk))
    assert not all(bitwise_equal(chunked, whole) for chunked, whole, _ in _chunked_prefill(control, page, chunk, torch.float32))


def test_bfloat16_is_close_to_float64():
    q, k, v, slot_table, seq_ids, positions = packed([40, 9], dtype=torch.bfloat16)
    out = attention(q, k, v, slot_table, seq_ids, positions, 0.25, constants=BF16)
    assert out.dtype == torch.bfloat16
    assert (out.cpu().double() - float64_attention(q, k, v, slot_table, seq_ids, positions, 0.25)).abs().max() < 0.05


def test_gradients_match_float64():
    q, k, v, slot_table, seq_ids, positions = packed([9, 4])
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*inputs, slot_table, seq_ids, positions, 0.25)
    weights = randn(*out.shape, seed=7)
    (out * weights).sum().backward()
    doubles = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    expected = torch.zeros(q.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        keys = slot_table[seq_ids[t], : int(positions[t]) + 1].cpu()
        kk, vv = doubles[1][keys].repeat_interleave(group, 1), doubles[2][keys].repeat_interleave(group, 1)
        probs = (torch.einsum("hd,nhd->hn", doubles[0][t], kk) * 0.25).softmax(-1)
        expected = expected.index_put((torch.tensor([t]),), torch.einsum("hn,nhd->hd", probs, vv)[None])
    (expected * weights.cpu().double()).sum().backward()
    for got, want in zip(inputs, doubles):
        assert (got.grad.cpu().double() - want.grad).abs().max() < 1e-4


def _float64_packed(q, k, v, slot_table, seq_ids, positions, scale):
    """Output and per-row log-sum-exp [H, T] of a packed causal batch in float64, on the CPU (differentiable)."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for t in range(q.shape[0]):
        keys = slot_table[seq_ids[t], : int(positions[t]) + 1].cpu()
        kk, vv = k[keys].repeat_interleave(group, 1), v[keys].repeat_interleave(group, 1)
        scores = torch.einsum("hd,nhd->hn", q[t], kk) * scale
        outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), vv))
        lses.append(scores.logsumexp(-1))
    return torch.stack(outs), torch.stack(lses, 1)


def test_the_log_sum_exp_output_is_the_rows_and_moves_no_bit():
    """What flash's backward takes from the forward: each row's log-sum-exp of its scaled scores. Asking
    for it leaves the output's bits; the control, another key block, moves them."""
    q, k, v, slot_table, seq_ids, positions = packed([40, 9, 1])
    config = dict(block_m=8, block_n=16, num_warps=4, num_stages=1)
    plain = attention_triton.attention_fwd(q, k, v, slot_table, seq_ids, positions, 0.25, None, torch.float32, **config)
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device=DEVICE)
    out = attention_triton.attention_fwd(q, k, v, slot_table, seq_ids, positions, 0.25, None, torch.float32, **config, lse=lse)
    assert bitwise_equal(out, plain)
    control = attention_triton.attention_fwd(q, k, v, slot_table, seq_ids, positions, 0.25, None, torch.float32, **{**config, "block_n": 32})
    assert not bitwise_equal(control, plain)
    _, want = _float64_packed(*(t.cpu().double() for t in (q, k, v)), slot_table.cpu(), seq_ids.cpu(), positions.cpu(), 0.25)
    assert (lse.cpu().double() - want).abs().max() < 1e-5


@pytest.mark.skipif(not ON_GPU, reason="flash's backward needs a GPU")
def test_packed_bfloat16_gradients_from_flash_backward_match_float64():
    """The trainer's case: a packed bf16 batch at a model's head size takes flash's backward over the Triton
    forward's output and log-sum-exp (no second forward); its gradients against float64's."""
    from isoexec.ops.attention import flash_backward

    lengths, scale = [300, 77, 128], 128**-0.5
    q, k, v, slot_table, seq_ids, positions = packed(lengths, heads=8, kv_heads=2, head_dim=128, dtype=torch.bfloat16)
    assert flash_backward.fits(q, k, torch.bfloat16, None, max(lengths))
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*inputs, slot_table, seq_ids, positions, scale, packed_len=max(lengths), constants=attention_triton.HOPPER_CONSTANTS)
    weights = randn(*out.shape, seed=7)
    (out.float() * weights).sum().backward()
    doubles = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    want, _ = _float64_packed(*doubles, slot_table.cpu(), seq_ids.cpu(), positions.cpu(), scale)
    (want * weights.cpu().double()).sum().backward()
    for got, expected in zip(inputs, doubles):
        error = (got.grad.cpu().double() - expected.grad).abs().max() / expected.grad.abs().max()
        assert error < 0.02, error


@pytest.mark.parametrize("spread", [False, True])
def test_a_store_of_one_slot_gives_a_one_key_row_its_value(spread, monkeypatch):
    """A cache of a single slot: on a GPU Triton specializes an integer argument of 1 into a constant, so the slot
    checks take the store size as given (`triton_steps._in_range`). A one-token sequence's row is its value exactly
    (one key: p = 1, l = 1), by the walk and by the spread decode."""
    from isoexec.ops.attention import triton_blocks

    calls = []
    if spread:
        monkeypatch.setattr(triton_blocks, "BLOCKS_MIN", 1)
        monkeypatch.setattr(triton_blocks, "BLOCKS_MAX_FILL", float("inf"))
        path = triton_blocks.attention_decode
        monkeypatch.setattr(triton_blocks, "attention_decode", lambda *args, **kwargs: calls.append(1) or path(*args, **kwargs))
    q, k, v, slot_table, seq_ids, positions = packed([1])
    assert k.shape[0] == 1
    assert torch.equal(attention(q, k, v, slot_table, seq_ids, positions, 0.25), v[:, [0, 0, 1, 1]])
    assert len(calls) == int(spread)


def test_rows_see_nothing_and_empty_batches():
    q, k, v, slot_table, seq_ids, positions = packed([5])
    slot_table[0, :] = -1  # no key of the sequence is in the store
    assert torch.equal(attention(q, k, v, slot_table, seq_ids, positions, 0.25), torch.zeros_like(q))
    empty = torch.empty(0, dtype=torch.int64, device=DEVICE)
    assert attention(q[:0], k, v, slot_table, empty, empty, 0.25).shape == (0, 4, 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slots_outside_the_store_below_every_row_are_skipped_with_the_decode_rows_bits(dtype):
    """A tile walks its whole key blocks unmasked once it has found all their slots in the store; a table with a slot
    outside it there (-1, or past the store) sends the tile down the masked walk. Either way each row of a prefill
    equals its decode row (one query a call) and float64 without those keys. The control, decode over key blocks of
    32 against the prefill's 16 (fp32 boundaries, where a re-blocked online softmax shows), must differ."""
    constants = CONSTANTS if dtype == torch.float32 else BF16
    q, k, v, slot_table, seq_ids, positions = packed([70], dtype=dtype)
    table = slot_table.clone()
    table[0, 5], table[0, 20] = -1, k.shape[0] + 3  # in the first and second key blocks of 16
    for slots in (slot_table, table):
        prefill = attention(q, k, v, slots, seq_ids, positions, 0.25, constants=constants)
        decoded = torch.cat([attention(q[t : t + 1], k, v, slots, seq_ids[:1], positions[t : t + 1], 0.25, constants=constants)
                             for t in range(40, 70)])
        assert bitwise_equal(prefill[40:], decoded)
    kept = [j for j in range(70) if j not in (5, 20)]  # rows 40+ see both holes; as if the keys were not there
    expected = float64_attention(q[40:], k[kept], v[kept], packed_slot_table(torch.tensor([0, 68], device=DEVICE))[0],
                                 seq_ids[40:], positions[40:] - 2, 0.25)
    assert (prefill[40:].cpu().double() - expected).abs().max() < (1e-5 if dtype == torch.float32 else 2e-2)
    q, k, v = (t.float() for t in (q, k, v))
    want = attention(q, k, v, table, seq_ids, positions, 0.25)[40:]
    reblocked = torch.cat([attention(q[t : t + 1], k, v, table, seq_ids[:1], positions[t : t + 1], 0.25, constants={**CONSTANTS, "block_n": 32})
                           for t in range(40, 70)])
    assert (int_view(reblocked) != int_view(want)).sum() > 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_blocks_of_a_tiles_positions_walked_checked_keep_the_masked_walks_bits(dtype, monkeypatch):
    """`CHECK_DIAGONAL` / `CHECK_DECODE_DIAGONAL`: a tile that found the slots of every key it sees in the store walks the
    blocks of its own positions by `_diagonal_block` (masks from positions alone) instead of `_block`. Every row keeps
    its bits: the trainer's packed batch, prefill in chunks of 5 over shuffled pages of 4 (chunks that start and end
    inside the blocks), decode steps, tiles of 16 and 64 rows, a table narrower than the positions, and a table with
    slots outside the store (the masked walk). The control, the same path over key blocks of 32 against 16 (fp32),
    differs."""
    constants = CONSTANTS if dtype == torch.float32 else BF16
    q, k, v, slot_table, seq_ids, positions = packed([37, 1, 20, 9], dtype=dtype)
    holed = slot_table.clone()
    holed[0, 20] = -1
    narrow = slot_table[:, :30].contiguous()  # rows of the 37-token sequence past 29 see keys 0..29

    def rows(op_constants):
        out = [attention(q, k, v, table, seq_ids, positions, 0.25, constants={**op_constants, **tile})
               for table in (slot_table, holed, narrow) for tile in ({}, {"block_m": 16})]
        out += [torch.cat([attention(q[t : t + 1], k, v, slot_table, seq_ids[t : t + 1], positions[t : t + 1], 0.25,
                                     constants=op_constants) for t in (36, 31, 16, 0, 50, 66)])]
        op = functools.partial(attention, constants=op_constants)
        out += [r for triple in _chunked_prefill(op, 4, 5, dtype) for r in triple]
        return out

    monkeypatch.setattr(attention_triton, "CHECK_DIAGONAL", False)
    monkeypatch.setattr(attention_triton, "CHECK_DECODE_DIAGONAL", False)
    want = rows(constants)
    monkeypatch.setattr(attention_triton, "CHECK_DIAGONAL", True)
    monkeypatch.setattr(attention_triton, "CHECK_DECODE_DIAGONAL", True)
    got = rows(constants)
    assert all(bitwise_equal(a, b) for a, b in zip(got, want))
    if dtype == torch.float32:
        reblocked = attention(q, k, v, slot_table, seq_ids, positions, 0.25, constants={**constants, "block_n": 32})
        assert (int_view(reblocked) != int_view(got[0])).sum() > 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_launch_order_of_the_programs_keeps_every_rows_bits(dtype, monkeypatch):
    """`HEADS_FASTEST` reads each program's query range and KV head from the launch's linear order, KV heads fastest:
    every (range, head) pair runs once, so a packed batch (4 KV heads, tiles of 8 and 64 rows), prefill chunks and
    decode steps keep the other order's bits. The control, key blocks of 32 against 16 (fp32), differs."""
    constants = CONSTANTS if dtype == torch.float32 else BF16
    q, k, v, slot_table, seq_ids, positions = packed([37, 1, 20, 9], heads=8, kv_heads=4, dtype=dtype)

    def rows():
        out = [attention(q, k, v, slot_table, seq_ids, positions, 0.25, constants={**constants, **tile})
               for tile in ({}, {"block_m": 64})]
        out += [torch.cat([attention(q[t : t + 1], k, v, slot_table, seq_ids[t : t + 1], positions[t : t + 1], 0.25,
                                     constants=constants) for t in (36, 16, 50, 66)])]
        op = functools.partial(attention, constants=constants)
        out += [r for triple in _chunked_prefill(op, 4, 5, dtype) for r in triple]
        return out

    monkeypatch.setattr(attention_triton, "HEADS_FASTEST", False)
    want = rows()
    monkeypatch.setattr(attention_triton, "HEADS_FASTEST", True)
    got = rows()
    assert all(bitwise_equal(a, b) for a, b in zip(got, want))
    if dtype == torch.float32:
        reblocked = attention(q, k, v, slot_table, seq_ids, positions, 0.25, constants={**constants, "block_n": 32})
        assert (int_view(reblocked) != int_view(got[0])).sum() > 100


def test_interleaved_and_non_consecutive_queries_form_their_own_tiles():
    """Queries of one sequence split by another's, or at positions that skip, start new tiles."""
    q, k, v, slot_table, _, _ = packed([30, 12])
    seq_ids = torch.tensor([0, 0, 1, 0, 0, 1, 1, 0, 0, 0], device=DEVICE)
    positions = torch.tensor([3, 4, 0, 5, 9, 1, 11, 15, 16, 17], device=DEVICE)
    out = attention(q[:10], k, v, slot_table, seq_ids, positions, 0.25)
    expected = float64_attention(q[:10], k, v, slot_table, seq_ids, positions, 0.25)
    assert (out.cpu().double() - expected).abs().max() < 1e-5


def _contract_with(impl_id: str, constants: dict):
    contract = load_preset("tiny-dense")
    composition = tuple(dataclasses.replace(e, impl=ImplRef(id=impl_id, version=1), constants=constants) if e.region == "attention" else e
                        for e in contract.composition)
    return dataclasses.replace(contract, composition=composition)


# Under the interpreter: the subnormal and huge-score hazards, a one-token sequence, and one window.
SMALL_PROBE = functools.partial(probe.probe, lengths=(40, 1, 16), window_lengths=(40, 16))
TINY_PROBE = functools.partial(probe.probe, lengths=(20, 1), window_lengths=())


def _battery(impl_id: str, constants: dict, registry=REGISTRY, small_probe=SMALL_PROBE):
    contract = _contract_with(impl_id, constants)
    return validate_entry(contract, contract.entry("attention", "trainer_fwd"), probe.probe if ON_GPU else small_probe,
                          registry=registry, device=DEVICE, dtypes=BATTERY_DTYPES)


@pytest.mark.parametrize("split_kv_size", [0, 32])
def test_the_battery_admits_attention_triton(split_kv_size):
    """Every sequence, in every form of every case (packed, chunked prefill over a poisoned paged
    cache, staggered decode), bitwise equal to itself computed alone. The control, a key block chosen
    from the batch, is the next test. (Native SDPA is none: whether it fails these trials depends on the
    CPU and the library build.) Tiles of 8 queries (16 rows, as full as the preset's 64-row tiles): half
    the programs of BF16's 4-query tiles, which the interpreter runs one by one; chunks and decode steps
    still cut them anywhere. Rows walked in one pass, and over spans of two key blocks (`split_kv_size`)."""
    result = _battery("attention.triton", {**BF16, "block_m": 16, "split_kv_size": split_kv_size})
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == BATTERY_DTYPES and result.trials >= 50


def _decode_rows_vs_training_rows(op, dtype, heads=4, lengths=(70, 33), steps=((69, 32), (50, 20), (31, 0), (32, 31))):
    """A real model's head shape (head_dim 128; heads = 4: Qwen3-0.6B's 2 query heads per KV head, 8:
    Qwen3-8B's 4) over two KV heads, as the probe takes them (more KV heads only add programs): the
    trainer's packed forward, and decode steps (one query per sequence) at the listed positions over the
    same keys. -> (training rows, decode rows), same order."""
    q, k, v, slot_table, seq_ids, positions = packed(list(lengths), heads=heads, kv_heads=2, head_dim=128, dtype=dtype)
    scale = 128**-0.5
    trained = op(q, k, v, slot_table, seq_ids, positions, scale)
    starts = [0, lengths[0]]
    want, got = [], []
    for step in steps:
        rows = torch.tensor([starts[b] + p for b, p in enumerate(step)], device=DEVICE)
        got.append(op(q[rows], k, v, slot_table, torch.arange(len(step), device=DEVICE), torch.tensor(step, device=DEVICE), scale))
        want.append(trained[rows])
    return torch.cat(want), torch.cat(got)


@pytest.mark.parametrize("heads", [4, 8])
def test_decode_rows_equal_training_rows_at_model_head_sizes(heads):
    """The preset's constants at a real model's head sizes. The battery's small probe (head_dim 16) did
    not show it, but on an H200 16-row decode tiles gave other bits than 64-row training tiles at
    head_dim 128 (the 0.6B audit matched 98 of 256 tokens). With 4 query heads per KV head a Hopper
    GPU runs the bf16 training tiles two per program (`attention_fwd`'s stacked tiles). The control, a
    variant with a smaller key block for decode batches, must fail the same comparison. It runs with fp32 boundaries, as the
    battery's fp32 pass does: a re-blocked online softmax moves fp32 results by an ulp or so, which a
    bf16 output hides for most elements. (attention.native cannot serve: on these shapes it gave both
    forms the same bits, on a CPU and on the H200.)"""
    preset = load_preset("tiny-dense-triton")
    constants = preset.entry("attention", "engine_decode").constants
    assert constants == preset.entry("attention", "trainer_fwd").constants
    fp32 = {**constants, "input_dtype": "float32", "output_dtype": "float32", "kv_cache_dtype": "float32"}
    for tile, dtype in ((constants, torch.bfloat16), (fp32, torch.float32)):
        want, got = _decode_rows_vs_training_rows(functools.partial(attention_triton.attention, **tile), dtype, heads)
        assert bitwise_equal(got, want), dtype

    def control(q, *args):
        return attention_triton.attention(q, *args, **{**fp32, "block_n": 16 if q.shape[0] <= 2 else 32})

    want, got = _decode_rows_vs_training_rows(control, torch.float32, heads)
    assert (int_view(got) != int_view(want)).sum() > 100


@pytest.mark.parametrize("heads", [4, 8])
def test_decode_rows_with_their_key_blocks_over_the_grid_equal_training_rows(heads, monkeypatch):
    """`triton_blocks.py`: decode rows whose key blocks' maxima, terms and fold run as three launches, at the preset's constants (bf16 and fp32 boundaries), bit for bit the training rows of
    the walk; and the path is the one taken. The control, the same path with a smaller key block for decode batches,
    re-blocks the online softmax and must fail the comparison (as in the test above)."""
    from isoexec.ops.attention import triton_blocks

    monkeypatch.setattr(triton_blocks, "BLOCKS_MIN", 1)
    monkeypatch.setattr(triton_blocks, "BLOCKS_MAX_FILL", float("inf"))  # on a GPU too, however many programs
    constants = load_preset("tiny-dense-triton").entry("attention", "engine_decode").constants
    _decode_path_rows_equal_training_rows(monkeypatch, triton_blocks, constants,
                                          lambda decode: {"block_n": 16 if decode else 32}, heads)


def _decode_path_rows_equal_training_rows(monkeypatch, module, constants, control, heads):
    """Decode rows at `constants` (bf16, and fp32 boundaries) bit for bit the training rows, every decode step through
    `module.attention_decode`; the control, the fp32 op with `control(is_decode)`'s constants for decode calls and for
    training, must differ."""
    calls = []
    path = module.attention_decode
    monkeypatch.setattr(module, "attention_decode", lambda *args, **kwargs: calls.append(1) or path(*args, **kwargs))
    fp32 = {**constants, "input_dtype": "float32", "output_dtype": "float32", "kv_cache_dtype": "float32"}
    for tile, dtype in ((constants, torch.bfloat16), (fp32, torch.float32)):
        want, got = _decode_rows_vs_training_rows(functools.partial(attention_triton.attention, **tile), dtype, heads)
        assert bitwise_equal(got, want), dtype
    assert len(calls) == 8  # every decode step of both dtypes took the path

    def controlled(q, *args):
        return attention_triton.attention(q, *args, **{**fp32, **control(q.shape[0] <= 2)})

    want, got = _decode_rows_vs_training_rows(controlled, torch.float32, heads)
    assert (int_view(got) != int_view(want)).sum() > 100


@pytest.mark.parametrize("constants", [CONSTANTS, BF16])
@pytest.mark.parametrize("fold_split, fold_max_split, fold_unroll, max_chunk, max_waves, max_run, ahead, scale",
                         [(1, 1, 1, 512, 4, 1, True, 0.25), (4, 16, 3, 16, 3, 4, True, 0.0884), (4, 16, 4, 512, 6, 2, False, 0.0884),
                          (4, 16, 4, 512, 6, 2, True, 0.25)])
def test_long_decode_rows_with_their_key_blocks_over_the_grid_equal_the_walks(constants, fold_split, fold_max_split, fold_unroll, max_chunk,
                                                                              max_waves, max_run, ahead, scale, monkeypatch):
    """Rows of 1,100 keys (69 blocks of 16), decoded at positions on and next to block edges, by the spread path (its
    fold in one program a row and head a block an iteration, or over 4 programs of a quarter of the columns each (on a
    GPU, up to 16 programs of one warp for these few rows), 3 blocks an iteration: rows of 69 blocks end
    mid-iteration; the earlier blocks' maxima read in one load, or in several of 16; the max kernel's runs those of
    the terms kernel, or longer; its blocks scored one a product, or 4 or 2 a product, runs ending mid-product; the max
    kernel's slots loaded a step ahead, or by the step; scores scaled by 0.25, exact, or by a scale that rounds) and by
    the walk, two of the long rows' keys outside the store (a slot of -1 and one past it: both skipped, their programs'
    blocks masked); the training rows are the walk's (the tests above). The control, the spread path over blocks of 32 against the walk's 16 (fp32 boundaries, where a
    re-blocked online softmax shows), must differ."""
    from isoexec.ops.attention import triton_blocks

    monkeypatch.setattr(triton_blocks, "FOLD_SPLIT", fold_split)
    monkeypatch.setattr(triton_blocks, "FOLD_MAX_SPLIT", fold_max_split)
    monkeypatch.setattr(triton_blocks, "FOLD_UNROLL", fold_unroll)
    monkeypatch.setattr(triton_blocks, "MAX_CHUNK", max_chunk)
    monkeypatch.setattr(triton_blocks, "MAX_PROGRAM_WAVES", max_waves)
    monkeypatch.setattr(triton_blocks, "MAX_RUN", max_run)
    monkeypatch.setattr(triton_blocks, "MAX_SLOTS_AHEAD", ahead)

    q, k, v, slot_table, seq_ids, positions = packed([1100, 40], dtype=torch.float32 if constants is CONSTANTS else torch.bfloat16)
    slot_table[0, 5], slot_table[0, 600] = -1, k.shape[0] + 7  # keys outside the store, in whole blocks of the long rows
    steps = [(1099, 39), (1024, 0), (1023, 16), (15, 17)]
    rows = torch.tensor([p for p, _ in steps] + [1100 + p for _, p in steps], device=DEVICE).view(2, -1).T.reshape(-1)
    ids, pos = torch.tensor([0, 1] * len(steps), device=DEVICE), torch.tensor([p for step in steps for p in step], device=DEVICE)

    def decode(blocks_min, constants=constants, q=q, k=k, v=v):
        monkeypatch.setattr(triton_blocks, "BLOCKS_MIN", blocks_min)
        monkeypatch.setattr(triton_blocks, "BLOCKS_MAX_FILL", float("inf"))
        return torch.cat([attention(q[rows[2 * i : 2 * i + 2]], k, v, slot_table, ids[:2], pos[2 * i : 2 * i + 2], scale, constants=constants)
                          for i in range(len(steps))])

    assert bitwise_equal(decode(1), decode(None))
    fp32 = [t.float() for t in (q, k, v)]
    walk = decode(None, {**CONSTANTS, "block_n": 16}, *fp32)
    assert (int_view(decode(1, {**CONSTANTS, "block_n": 32}, *fp32)) != int_view(walk)).sum() > 100


def test_the_blocks_kernels_take_as_many_programs_an_sm_as_one_sm_holds(monkeypatch):
    """The spread decode's blocks kernels deal a row's blocks to as many programs an SM as fit at once. On an H100's SM
    (65,536 registers, 2,048 threads, 228 KB of shared memory) and 4-warp programs: 120 or 128 registers and 32 KB (the
    max and terms kernels at Qwen3-8B's heads) fit 4, 152 fit 3, 213 with 65 KB (the terms kernel at head_dim 256)
    fit 2, 160 with 64 KB fit 3 by registers and shared memory alike; 16 warps of few registers are bound by the threads,
    a huge tile by shared memory, and at least one always runs. Off a GPU a row takes 3 programs (PROGRAM_WAVES None),
    or the number set less one; on a GPU a set number of programs an SM decides alone, at most one a block."""
    from isoexec.ops.attention import triton_blocks

    h100 = (65536, 2048, 233472)
    assert [triton_blocks.programs_that_fit(r, 4, s, h100) for r, s in ((120, 32768), (128, 33792), (152, 33792), (213, 66560),
                                                                        (160, 65536))] == [4, 4, 3, 2, 3]
    assert triton_blocks.programs_that_fit(32, 16, 0, h100) == 4
    assert triton_blocks.programs_that_fit(64, 4, 200_000, h100) == 1
    assert triton_blocks.programs_that_fit(255, 32, 0, h100) == 1
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert triton_blocks._programs_a_row(None, None, (), {}, 8, 64, cpu) == 3
    assert triton_blocks._programs_a_row(None, 6, (), {}, 8, 64, cpu) == 5
    assert triton_blocks._programs_a_row(None, 6, (), {}, 8, 2, cpu) == 2
    monkeypatch.setattr(triton_blocks, "_num_sms", lambda device: 132)
    assert triton_blocks._programs_a_row(None, 4, (), {}, 64, 64, cuda) == 9  # cdiv(4 x 132, 64)
    assert triton_blocks._programs_a_row(None, 4, (), {}, 8, 64, cuda) == 64  # at most one a block


def test_the_fold_splits_its_columns_further_only_where_a_call_has_few_rows(monkeypatch):
    """On a GPU of 132 SMs the spread decode's fold takes 16 one-warp programs a (query, KV head) at batch 1 with 8 KV
    heads (128 programs), 8 at batch 2, and FOLD_SPLIT of FOLD_WARPS from batch 4 (where more programs lost on an H100);
    never more programs than columns; off a GPU always FOLD_SPLIT. (Each element's chain is the same whatever the split:
    the long spread-decode test above folds over 1 and 4 programs.)"""
    from isoexec.ops.attention import triton_blocks

    monkeypatch.setattr(triton_blocks, "_num_sms", lambda device: 132)
    cuda, preset = torch.device("cuda"), (triton_blocks.FOLD_SPLIT, triton_blocks.FOLD_WARPS)
    assert preset == (4, 2)
    assert triton_blocks._fold_programs(8, 128, cuda) == (16, 1)
    assert triton_blocks._fold_programs(16, 128, cuda) == (8, 1)
    assert triton_blocks._fold_programs(32, 128, cuda) == preset
    assert triton_blocks._fold_programs(64, 128, cuda) == preset
    assert triton_blocks._fold_programs(1, 8, cuda) == (8, 1)
    assert triton_blocks._fold_programs(8, 128, torch.device("cpu")) == preset


@pytest.mark.parametrize("split_kv_size", [16, 32])
def test_rows_over_spans_are_bitwise_equal_in_every_form(split_kv_size):
    """split_kv_size > 0: each row's walk restarts every span of 1 or 2 key blocks (pairs of blocks, and none) and the
    spans combine in order. Chunked prefill (chunks of 5 over pages of 4), the prompt in one call and the trainer's packed
    batch give every row the same bits, and differ from the one-pass walk past the first span (other arithmetic: 5 of
    the 37-token prompt's rows at spans of 32)."""
    op = functools.partial(attention, constants={**CONSTANTS, "split_kv_size": split_kv_size})
    rows = list(_chunked_prefill(op, 4, 5, torch.float32))
    for chunked, whole, trainer in rows:
        assert bitwise_equal(chunked, whole) and bitwise_equal(whole, trainer)
    one_pass = list(_chunked_prefill(attention, 4, 5, torch.float32))
    assert sum(int((int_view(a[0]) != int_view(b[0])).sum()) for a, b in zip(rows, one_pass)) > 20


def test_rows_within_their_first_span_keep_the_one_pass_bits_and_narrow_tables_skip_spans(monkeypatch):
    """A row inside its first span has the one-pass walk's bits (the span's state, combined into the empty total,
    comes back as it is), so a call whose table is no wider than a span runs without spans: in a packed batch whose
    table is wider (the tile over spans), its first-span rows equal the calls over narrow tables (no spans) bit for
    bit, decode steps included, and no narrow call takes the spans path. The rows past the first span differ."""
    from isoexec.ops.attention import triton_spans

    calls = []
    two_launches = triton_spans.attention_decode
    monkeypatch.setattr(triton_spans, "attention_decode", lambda *args, **kwargs: calls.append(1) or two_launches(*args, **kwargs))
    spans = {**CONSTANTS, "split_kv_size": 64}
    q, k, v, slot_table, seq_ids, positions = packed([100, 37])
    trained = attention(q, k, v, slot_table, seq_ids, positions, 0.25, constants=spans)
    narrow = slot_table[:, :64]
    first = positions < 64
    alone = attention(q[first], k, v, narrow, seq_ids[first], positions[first], 0.25, constants=spans)
    assert bitwise_equal(alone, trained[first])
    for rows in ([63, 100 + 36], [40, 100 + 5]):  # one query per sequence: decode steps
        rows = torch.tensor(rows, device=DEVICE)
        decoded = attention(q[rows], k, v, narrow, seq_ids[rows], positions[rows], 0.25, constants=spans)
        assert bitwise_equal(decoded, trained[rows])
    assert not calls
    one_pass = attention(q, k, v, slot_table, seq_ids, positions, 0.25)
    assert bitwise_equal(one_pass[first], trained[first])
    assert (int_view(one_pass[~first]) != int_view(trained[~first])).sum() > 100


@pytest.mark.parametrize("heads", [4, 8])
def test_decode_rows_over_spans_equal_training_rows(heads, monkeypatch):
    """`triton_spans.py`: decode steps whose spans (2 key blocks of the preset's 32) run in programs of their own and
    combine in a second launch, at the preset's tile (bf16 and fp32 boundaries), bit for bit the training rows, which
    walk the same spans in one program; and the path is the one taken. The control, decode over spans of one block
    against training over two (a span size chosen from the batch), must fail the comparison."""
    from isoexec.ops.attention import triton_spans

    constants = {**load_preset("tiny-dense-triton").entry("attention", "engine_decode").constants, "split_kv_size": 64}
    _decode_path_rows_equal_training_rows(monkeypatch, triton_spans, constants, lambda decode: {"split_kv_size": 32 if decode else 64},
                                          heads)


@pytest.mark.parametrize("constants", [CONSTANTS, BF16])
@pytest.mark.parametrize("split_kv_size", [48, 64])
def test_long_decode_rows_over_spans_equal_the_walks(constants, split_kv_size, monkeypatch):
    """Rows of 1,100 keys (23 or 18 spans of 3 or 4 blocks of 16: the combine pipelined over many), decoded at positions
    on and next to span and block edges, over spans in two launches (pairs of blocks in even spans) and by the walk over
    the same spans in one program (ISOEXEC_ATTENTION_SPANS=0), block by block and by pairs, two of the long rows' keys
    outside the store (a slot of -1 and one past it): the same bits. The control, spans of 4 blocks against 3 (fp32
    boundaries), differs."""
    from isoexec.ops.attention import triton_spans

    q, k, v, slot_table, seq_ids, positions = packed([1100, 40], dtype=torch.float32 if constants is CONSTANTS else torch.bfloat16)
    slot_table[0, 5], slot_table[0, 600] = -1, k.shape[0] + 7  # keys outside the store, in whole blocks of the long rows
    steps = [(1099, 39), (1055, 0), (1056, 16), (47, 17)]
    rows = torch.tensor([p for p, _ in steps] + [1100 + p for _, p in steps], device=DEVICE).view(2, -1).T.reshape(-1)
    ids, pos = torch.tensor([0, 1] * len(steps), device=DEVICE), torch.tensor([p for step in steps for p in step], device=DEVICE)

    def decode(enabled, constants, q=q, k=k, v=v):
        monkeypatch.setattr(triton_spans, "ENABLED", enabled)
        return torch.cat([attention(q[rows[2 * i : 2 * i + 2]], k, v, slot_table, ids[:2], pos[2 * i : 2 * i + 2], 0.25, constants=constants)
                          for i in range(len(steps))])

    spans = {**constants, "split_kv_size": split_kv_size}
    two_launches = decode(True, spans)
    assert bitwise_equal(two_launches, decode(False, spans))
    monkeypatch.setattr(attention_triton, "PAIRS_WITH_SPANS", True)  # the walk by pairs of blocks where spans are even
    assert bitwise_equal(two_launches, decode(False, spans))
    monkeypatch.setattr(attention_triton, "PAIRS_WITH_SPANS", False)
    fp32 = [t.float() for t in (q, k, v)]
    walk = decode(False, {**CONSTANTS, "split_kv_size": 48}, *fp32)
    assert (int_view(decode(True, {**CONSTANTS, "split_kv_size": 64}, *fp32)) != int_view(walk)).sum() > 100


def test_the_spread_decode_knob_reads_the_environment_and_refuses_bad_values(monkeypatch):
    """ISOEXEC_ATTENTION_BLOCKS_MIN: a number of key blocks (unset: the default, 8), or off; anything else is refused in
    one line."""
    from isoexec.ops.attention import triton_blocks

    for value, parsed in (("", 8), ("off", None), ("1", 1), ("64", 64)):
        monkeypatch.setenv("ISOEXEC_ATTENTION_BLOCKS_MIN", value)
        assert triton_blocks._env_blocks("ISOEXEC_ATTENTION_BLOCKS_MIN", 8) == parsed
    for value in ("0", "-3", "many", "1.5"):
        monkeypatch.setenv("ISOEXEC_ATTENTION_BLOCKS_MIN", value)
        with pytest.raises(ValueError, match="ISOEXEC_ATTENTION_BLOCKS_MIN must be a positive number of key blocks or 'off'"):
            triton_blocks._env_blocks("ISOEXEC_ATTENTION_BLOCKS_MIN", 8)
    monkeypatch.setattr(triton_blocks, "BLOCKS_MIN", None)  # off
    assert not triton_blocks.applies(1, 8, 128, torch.device("cpu"))
    monkeypatch.setattr(triton_blocks, "BLOCKS_MIN", 64)  # on for tables of 64 key blocks or more
    assert triton_blocks.applies(1, 8, 128, torch.device("cpu")) and not triton_blocks.applies(1, 8, 32, torch.device("cpu"))


def test_a_key_block_chosen_from_the_batch_is_caught():
    """A variant whose key block grows with the number of queries re-blocks the online softmax."""
    def block_from_batch(q, *args, block_n, **constants):
        return attention_triton.attention(q, *args, block_n=16 if q.shape[0] <= 16 else 32, **constants)

    registry = Registry()
    registry.register(Impl(id="attention.triton", version=1, region="attention", cases=attention_triton.ALL_CASES, fn=block_from_batch))
    result = _battery("attention.triton", BF16, registry, TINY_PROBE)
    assert result.status == "rejected"


def test_bad_constants_and_shapes_are_refused():
    check = attention_triton.check_constants
    for change, message in [({"split_kv_size": 24}, "split_kv_size must be 0 or a positive multiple of block_n"),
                            ({"block_n": 8}, "block_n must be >= 16"),
                            ({"block_m": 12}, "block_m must be a power of two"), ({"accum_dtype": "float64"}, "float32 only"),
                            ({"kv_cache_dtype": "bfloat16"}, "must match")]:
        with pytest.raises(ValueError, match=message):
            check({**CONSTANTS, **change})
    q, k, v, slot_table, seq_ids, positions = packed([4], head_dim=24)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        attention(q, k, v, slot_table, seq_ids, positions, 0.25)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_a_decode_step_can_be_captured_in_a_cuda_graph():
    q, k, v, slot_table, seq_ids, positions = packed([40, 9, 17], dtype=torch.bfloat16)
    last = torch.tensor([39, 48, 65], device=DEVICE)
    qd, sd, pd = q[last].clone(), seq_ids[last].clone(), positions[last].clone()
    eager = attention(qd, k, v, slot_table, sd, pd, 0.25, constants=BF16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attention(qd, k, v, slot_table, sd, pd, 0.25, constants=BF16)
    graph.replay()
    assert torch.equal(captured.view(torch.int16), eager.view(torch.int16))


@pytest.mark.parametrize("dtype,constants", [(torch.float32, CONSTANTS), (torch.bfloat16, BF16)])
def test_tile_constants_leave_every_bit(dtype, constants):
    """At head_dim 16, block_m (rows per tile: queries per tile and per program), num_warps and num_stages
    only regroup rows, so every output keeps its bits, on the GPU too. (At head_dim 128 an H200 gave
    16-row and 64-row tiles other bits, which is why the preset pins one tile for every case.) block_n
    re-blocks the online softmax, and the same comparison sees it in float32 (the control; rounding these
    small rows to bfloat16 hides it)."""
    args = (*packed([37, 1, 20, 9], dtype=dtype), 0.25)
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    base = attention(*args, constants={**constants, "block_m": 1})
    # block_m 2 is block_m 1's tile here (one query of two heads, padded to 16 rows), so it is not run again.
    for change in ({"block_m": 4}, {"block_m": 16}, {"block_m": 64, "num_warps": 8, "num_stages": 2}):
        assert torch.equal(attention(*args, constants={**constants, **change}).view(bits), base.view(bits)), change
    if dtype == torch.float32:
        assert not torch.equal(attention(*args, constants={**constants, "block_n": 32}).view(bits), base.view(bits))
