import pytest
import torch

from conftest import entry_index, mutated
from controls import CONTROLS, control_contract
from isoexec.contract import load_preset
from isoexec.ops.attention import reference
from isoexec.ops.attention.metadata import UNUSED_SLOT, packed_slot_table, paged_slot_table
from isoexec.runtime.registry import REGISTRY, Impl, Registry, ResolutionError
from isoexec.validate.battery import validate_entry

H, HKV, D = 4, 2, 16
SCALE = D**-0.5
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


def reference_op(dtype=torch.float32, accum_dtype="float32", block_n=16, reduce_block=16, **overrides):
    name = str(dtype).removeprefix("torch.")
    constants = dict(input_dtype=name, output_dtype=name, kv_cache_dtype=name, accum_dtype=accum_dtype, block_n=block_n,
                     reduce_block=reduce_block, block_tree="balanced_binary", split_kv_size=0)
    return REGISTRY.get("attention.reference", 1).bind({**constants, **overrides})


def native_op(dtype=torch.float32):
    name = str(dtype).removeprefix("torch.")
    return REGISTRY.get("attention.native", 1).bind(dict(input_dtype=name, output_dtype=name, kv_cache_dtype=name))


def bits(t):
    return t.detach().contiguous().view(INT_VIEW[t.dtype])


def make_seqs(lengths, dtype=torch.float32, num_heads=H, num_kv_heads=HKV, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(n, heads, D, generator=g).to(dtype) for heads in (num_heads, num_kv_heads, num_kv_heads)) for n in lengths]


def run_packed(op, seqs, window=None):
    """All sequences packed back to back in one call -> one output per sequence."""
    lengths = [q.shape[0] for q, _, _ in seqs]
    cu_seqlens = torch.tensor([0, *lengths]).cumsum(0)
    slot_table, seq_ids, positions = packed_slot_table(cu_seqlens)
    q, k, v = (torch.cat(parts) for parts in zip(*seqs))
    return list(op(q, k, v, slot_table, seq_ids, positions, SCALE, window).split(lengths))


class PagedCache:
    """Pages of 16 slots handed out in shuffled order; every slot is NaN until written."""

    def __init__(self, seqs, page_size=16, seed=1):
        pages_per_seq = [-(-q.shape[0] // page_size) for q, _, _ in seqs]
        order = torch.randperm(sum(pages_per_seq) + 1, generator=torch.Generator().manual_seed(seed))
        block_table = torch.full((len(seqs), max(pages_per_seq)), UNUSED_SLOT)
        for b, first in enumerate(torch.tensor([0, *pages_per_seq]).cumsum(0)[:-1].tolist()):
            block_table[b, : pages_per_seq[b]] = order[first : first + pages_per_seq[b]]
        self.seqs = seqs
        self.slot_table = paged_slot_table(block_table, page_size, block_table.shape[1] * page_size)
        num_slots = len(order) * page_size
        self.k = torch.full((num_slots, HKV, D), float("nan"), dtype=seqs[0][1].dtype)
        self.v = torch.full_like(self.k, float("nan"))

    def step(self, op, spans, window=None):
        """One engine call: spans are (sequence, start, stop) query ranges, written to the cache first."""
        for b, start, stop in spans:
            slots = self.slot_table[b, start:stop]
            self.k[slots], self.v[slots] = self.seqs[b][1][start:stop], self.seqs[b][2][start:stop]
        q = torch.cat([self.seqs[b][0][start:stop] for b, start, stop in spans])
        seq_ids = torch.cat([torch.full((stop - start,), b) for b, start, stop in spans])
        positions = torch.cat([torch.arange(start, stop) for _, start, stop in spans])
        out = op(q, self.k, self.v, self.slot_table, seq_ids, positions, SCALE, window)
        return out.split([stop - start for _, start, stop in spans])


def run_prefill(op, seqs, chunk, window=None):
    cache, pieces = PagedCache(seqs), [[] for _ in seqs]
    for start in range(0, max(q.shape[0] for q, _, _ in seqs), chunk):
        spans = [(b, start, min(start + chunk, q.shape[0])) for b, (q, _, _) in enumerate(seqs) if start < q.shape[0]]
        for (b, _, _), out in zip(spans, cache.step(op, spans, window)):
            pieces[b].append(out)
    return [torch.cat(p) for p in pieces]


def run_decode(op, seqs, window=None):
    return run_prefill(op, seqs, 1, window)


def naive(q, k, v, scale, window=None):
    """Textbook float64 softmax attention of one sequence: q [L, H, D], k, v [L, Hkv, D] -> [L, H, D]."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q, k) * scale
    i, j = torch.arange(q.shape[0])[:, None], torch.arange(q.shape[0])
    mask = (j <= i) & ((j > i - window) if window is not None else True)
    return torch.einsum("hij,jhd->ihd", torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1), v)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (4, 1), (2, 2)])
@pytest.mark.parametrize("window", [None, 5, 16])
@pytest.mark.parametrize("block_n", [16, 8])
def test_matches_float64_softmax_attention(dtype, tol, num_heads, num_kv_heads, window, block_n):
    lengths = (1, 7, 16, 23, 40)  # partial, exact and multiple key blocks
    seqs = make_seqs(lengths, dtype, num_heads, num_kv_heads)
    outs = run_packed(reference_op(dtype, block_n=block_n), seqs, window)
    for (q, k, v), out in zip(seqs, outs):
        assert out.dtype == dtype and out.shape == q.shape
        torch.testing.assert_close(out.double(), naive(q, k, v, SCALE, window), atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [None, 3])
def test_gradients_match_float64_finite_differences(window):
    op = reference_op(torch.float64, accum_dtype="float64", block_n=4, reduce_block=4)
    g = torch.Generator().manual_seed(0)
    slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, 3, 9]))
    q = torch.randn(9, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(9, 1, 4, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(9, 1, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: op(q, k, v, slot_table, seq_ids, positions, 0.5, window), (q, k, v))


def test_gradient_never_sees_poisoned_slots():
    seqs = make_seqs((21,))
    cache = PagedCache(seqs)
    cache.step(lambda *args: torch.zeros(21, H, D), [(0, 0, 21)])  # write the keys only
    q = seqs[0][0].clone().requires_grad_()
    k_store, v_store = cache.k.clone().requires_grad_(), cache.v.clone().requires_grad_()
    out = reference_op()(q, k_store, v_store, cache.slot_table, torch.zeros(21, dtype=torch.int64), torch.arange(21), SCALE)
    out.square().sum().backward()
    written = torch.zeros(k_store.shape[0], dtype=torch.bool)
    written[cache.slot_table[0, :21]] = True
    assert torch.isfinite(q.grad).all()
    assert torch.isfinite(k_store.grad[written]).all() and (k_store.grad[~written] == 0).all()
    assert torch.isfinite(v_store.grad[written]).all() and (v_store.grad[~written] == 0).all()


def forms(op, dtype, window):
    """The target sequence (length 37) computed in every form; the first is the sequence alone."""
    target, others = make_seqs((37,), dtype, seed=3), make_seqs((16, 5, 50), dtype, seed=4)
    yield "alone", run_packed(op, target, window)[0]
    yield "packed among others", run_packed(op, [others[0], *target, *others[1:]], window)[1]
    for chunk in (16, 32, 5, 37):
        yield f"prefill in chunks of {chunk}", run_prefill(op, [*target, *others], chunk, window)[0]
    yield "prefill alone", run_prefill(op, target, 37, window)[0]
    yield "decode among others", run_decode(op, [*others, *target], window)[-1]
    yield "decode alone", run_decode(op, target, window)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("split_kv_size", [0, 32])
def test_reference_is_bitwise_equal_in_every_form(dtype, window, split_kv_size):
    """Every form of a row gives its bits, walked in one pass or over spans of two key blocks."""
    results = dict(forms(reference_op(dtype, split_kv_size=split_kv_size), dtype, window))
    alone = results.pop("alone")
    for form, out in results.items():
        assert torch.equal(bits(out), bits(alone)), form


@pytest.mark.parametrize("split_kv_size", [16, 32, 48])
@pytest.mark.parametrize("window", [None, 20])
def test_spans_match_float64_and_are_other_arithmetic(split_kv_size, window):
    """Spans of 1-3 key blocks: within float32 rounding of float64's softmax, and (the walk restarted and combined)
    other bits than the one-pass walk's for rows longer than a span; rows within one span keep the one-pass bits
    (a total that starts at (-inf, 0, 0) times 0 plus the span's own state times exp(0) = 1)."""
    seqs = make_seqs((7, 16, 40, 61))
    spans = run_packed(reference_op(split_kv_size=split_kv_size), seqs, window)
    walk = run_packed(reference_op(), seqs, window)
    for (q, k, v), out, one_pass in zip(seqs, spans, walk):
        torch.testing.assert_close(out.double(), naive(q, k, v, SCALE, window), atol=2e-6, rtol=2e-6)
        short = min(q.shape[0], split_kv_size)
        assert torch.equal(bits(out[:short]), bits(one_pass[:short]))
    assert sum(int((bits(out) != bits(one_pass)).sum()) for out, one_pass in zip(spans, walk)) > 100


def control_op(dtype=torch.float32):
    """The reference's constants on `controls.key_block_attention`: key blocks twice as wide for more than
    controls.SMALL queries, so it is batch-dependent by construction."""
    name = str(dtype).removeprefix("torch.")
    constants = dict(input_dtype=name, output_dtype=name, kv_cache_dtype=name, accum_dtype="float32", block_n=16, reduce_block=16,
                     block_tree="balanced_binary", split_kv_size=0)
    return CONTROLS["attention"].bind(constants)


def test_a_batch_dependent_key_block_differs_in_some_form():
    """The negative control of the test above, in fp32: re-blocking the online softmax moves results by
    an ulp or so, which a bf16 output hides in most of these 2,368 elements. (Native SDPA cannot serve:
    whether it gives a row other bits alone and in a batch depends on the CPU and the library build.)"""
    dtype = torch.float32
    results = dict(forms(control_op(dtype), dtype, None))
    alone = results.pop("alone")
    differing = [form for form, out in results.items() if not torch.equal(bits(out), bits(alone))]
    assert "decode alone" in differing and "decode among others" in differing


def test_battery_admits_reference_and_rejects_a_batch_dependent_key_block():
    dense = load_preset("tiny-dense")
    admitted = validate_entry(dense, dense.entry("attention", "trainer_fwd"), REGISTRY.probe("attention"), registry=REGISTRY,
                              device=torch.device("cpu"))
    assert admitted.status == "admitted", admitted.failures[:5]
    assert admitted.dtypes == ("bfloat16", "float32") and admitted.trials > 100
    control = control_contract("attention")
    rejected = validate_entry(control, control.entry("attention", "trainer_fwd"), REGISTRY.probe("attention"), registry=REGISTRY,
                              device=torch.device("cpu"))
    assert rejected.status == "rejected"
    assert not any("raised" in failure for failure in rejected.failures), rejected.failures[:5]


def test_poison_in_unused_and_future_slots_does_not_leak():
    seqs = make_seqs((40, 9))
    poisoned = run_prefill(reference_op(), seqs, 7)  # future keys of the current block are still NaN
    for (q, k, v), out in zip(seqs, poisoned):
        assert torch.isfinite(out).all()
        assert torch.equal(bits(out), bits(run_packed(reference_op(), [(q, k, v)])[0]))


def test_blocks_a_row_does_not_see_leave_its_state_untouched():
    """Row 31's output is -0.0 (negative values in keys [0, 16), then scores so large that alpha = 0
    against values of -0.0 in [16, 32)); walking block [32, 48) for the longer rows must keep it."""
    (q, k, v), = make_seqs((48,))
    v[:16] = -v[:16].abs()
    q[31] = q[31].abs()
    k[16:32], v[16:32] = 64.0, -0.0
    packed = run_packed(reference_op(), [(q, k, v)])[0][31]
    alone = reference_op()(q[31:32], k, v, torch.arange(48)[None], torch.zeros(1, dtype=torch.int64), torch.tensor([31]), SCALE)[0]
    assert torch.equal(bits(alone), bits(torch.full((H, D), -0.0)))
    assert torch.equal(bits(packed), bits(alone))


def test_row_without_visible_keys_is_zero():
    (q, k, v), = make_seqs((4,))
    slot_table = torch.arange(4)[None]  # keys 0..3 only
    positions = torch.tensor([2, 10, 3])  # the second query's window (8, 10] lies past the table
    out = reference_op()(q[[0, 1, 2]], k, v, slot_table, torch.zeros(3, dtype=torch.int64), positions, SCALE, 3)
    assert torch.equal(bits(out[1]), bits(torch.zeros(H, D)))
    alone = reference_op()(q[[0]], k, v, slot_table, torch.zeros(1, dtype=torch.int64), positions[:1], SCALE, 3)
    assert torch.equal(bits(out[0]), bits(alone[0]))


def test_empty_query_batch():
    (q, k, v), = make_seqs((5,))
    empty = torch.empty(0, dtype=torch.int64)
    for op in (reference_op(), native_op()):
        out = op(q[:0], k, v, torch.arange(5)[None], empty, empty, SCALE)
        assert out.shape == (0, H, D) and out.dtype == torch.float32


def test_metadata_helpers():
    slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, 3, 5]))
    assert slot_table.tolist() == [[0, 1, 2], [3, 4, UNUSED_SLOT]]
    assert seq_ids.tolist() == [0, 0, 0, 1, 1] and positions.tolist() == [0, 1, 2, 0, 1]
    slots = paged_slot_table(torch.tensor([[2, 0], [1, -1]]), 4, 10)
    assert slots.tolist() == [[8, 9, 10, 11, 0, 1, 2, 3, -1, -1], [4, 5, 6, 7, -1, -1, -1, -1, -1, -1]]


def _call(op, q, k, v, **kwargs):
    n = q.shape[0]
    args = dict(slot_table=torch.arange(n)[None], seq_ids=torch.zeros(n, dtype=torch.int64), positions=torch.arange(n))
    args.update(kwargs)
    return op(q, k, v, args["slot_table"], args["seq_ids"], args["positions"], SCALE, args.get("window"))


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_mismatched_heads_raise(impl):
    op = reference_op() if impl == "reference" else native_op()
    q, k = torch.randn(3, 3, D), torch.randn(3, 2, D)
    with pytest.raises(ValueError, match="multiple"):
        _call(op, q, k, k)
    with pytest.raises(ValueError):
        _call(op, torch.randn(3, 4, D), k, torch.randn(3, 2, D + 1))


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_wrong_dtype_raises(impl):
    op = reference_op(torch.bfloat16) if impl == "reference" else native_op(torch.bfloat16)
    q, k = torch.randn(3, H, D), torch.randn(3, HKV, D).bfloat16()
    with pytest.raises(ValueError, match="attention query must be bfloat16"):
        _call(op, q, k, k)
    with pytest.raises(ValueError, match="key store must be bfloat16"):
        _call(op, q.bfloat16(), k.float(), k)


def test_bad_metadata_raises():
    op = reference_op()
    q, k = torch.randn(3, H, D), torch.randn(3, HKV, D)
    with pytest.raises(ValueError, match="seq_ids"):
        _call(op, q, k, k, seq_ids=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="integer"):
        _call(op, q, k, k, positions=torch.arange(3.0))
    with pytest.raises(ValueError, match="window"):
        _call(op, q, k, k, window=0)
    with pytest.raises(ValueError, match="outside the key/value store"):
        _call(op, q, k, k, slot_table=torch.tensor([[0, 1, 7]]))


def test_spans_of_part_of_a_key_block_are_refused_at_resolve_time(dense):
    def split_kv(data):
        data["composition"][entry_index(data, "attention")]["constants"]["split_kv_size"] = 24

    with pytest.raises(ResolutionError, match="split_kv_size must be 0 or a positive multiple of block_n"):
        REGISTRY.resolve(mutated(dense, split_kv))
    (q, k, v), = make_seqs((1,))
    with pytest.raises(ValueError, match=r"split_kv_size must be 0 or a positive multiple of block_n \(16\), got 24"):
        reference.attention(q, k, v, torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                            torch.zeros(1, dtype=torch.int64), SCALE, **{**reference_op().keywords, "split_kv_size": 24})


def test_a_contract_fitted_to_a_model_is_probed_at_its_head_sizes():
    """An impl whose decode rows go wrong only at head_dim >= 64 (as 16-row MMA tiles did at head_dim 128
    on an H200) passes the probe's own small heads and fails when the probe takes the fitted model's
    head_dim and grouping (`validate(..., spec=...)` passes them as `geometry`)."""
    from isoexec.model import PRESETS

    reference = REGISTRY.get("attention.reference", 1)

    def wide_heads_drift_in_decode(q, k_store, v_store, slot_table, seq_ids, positions, scale, window=None, packed_len=None, **constants):
        out = reference.fn(q, k_store, v_store, slot_table, seq_ids, positions, scale, window, packed_len, **constants)
        if q.shape[-1] >= 64 and 0 < q.shape[0] <= slot_table.shape[0]:  # one query per sequence: decode
            out = (out.view(torch.int16) ^ 1).view(out.dtype) if out.dtype == torch.bfloat16 else torch.nextafter(out, torch.full_like(out, float("inf")))
        return out

    registry = Registry()
    registry.register(Impl(id="attention.reference", version=1, region="attention", cases=reference.cases, fn=wide_heads_drift_in_decode))
    registry.register_probe("attention", REGISTRY.probe("attention"))
    dense = load_preset("tiny-dense")
    entry = dense.entry("attention", "trainer_fwd")
    spec = PRESETS["qwen3-0.6b-random"]
    attention = spec.attention[0]
    geometry = {"num_heads": attention.num_heads, "num_kv_heads": attention.num_kv_heads, "head_dim": attention.head_dim}
    small = validate_entry(dense, entry, registry.probe("attention"), registry=registry, device=torch.device("cpu"))
    assert small.status == "admitted", small.failures[:3]
    fitted = validate_entry(dense, entry, registry.probe("attention"), registry=registry, device=torch.device("cpu"), geometry=geometry)
    assert fitted.status == "rejected" and any("engine_decode" in failure for failure in fitted.failures)
