"""attention.native's paths (one SDPA call per row, one for packed whole sequences, one per sequence)
against attention.reference."""

import pytest
import torch

from isoexec.ops.attention import native
from isoexec.ops.attention.metadata import UNUSED_SLOT, packed_slot_table, paged_slot_table
from isoexec.runtime.registry import REGISTRY

pytestmark = pytest.mark.gpu

D = 16
SCALE = D**-0.5
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2e-2}
PATHS = {"per_row": native._per_row, "per_sequence": native._per_sequence}


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def reference_op(dtype):
    accum = "float64" if dtype == torch.float64 else "float32"
    return REGISTRY.get("attention.reference", 1).bind(dict(
        input_dtype=_name(dtype), output_dtype=_name(dtype), kv_cache_dtype=_name(dtype), accum_dtype=accum, block_n=16,
        reduce_block=16, block_tree="balanced_binary", split_kv_size=0))


def native_op(dtype):
    return REGISTRY.get("attention.native", 1).bind(dict(input_dtype=_name(dtype), output_dtype=_name(dtype), kv_cache_dtype=_name(dtype)))


def packed(lengths, num_heads, num_kv_heads, dtype, seed=0):
    """Sequences packed back to back: (q, k_store, v_store, slot_table, seq_ids, positions)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, D, generator=g).to(dtype) for heads in (num_heads, num_kv_heads, num_kv_heads))
    return (q, k, v, *packed_slot_table(torch.tensor([0, *lengths]).cumsum(0)))


def paged(lengths, num_heads, num_kv_heads, dtype, chunk, seed=0, page_size=4):
    """The last step of a chunked prefill (chunk 1: a decode step) over a paged cache whose pages are
    shuffled and whose unwritten slots are NaN: (q, k_store, v_store, slot_table, seq_ids, positions)."""
    g = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-n // page_size) for n in lengths]
    order = torch.randperm(sum(pages_per_seq) + 2, generator=g)
    block_table = torch.full((len(lengths), max(pages_per_seq)), UNUSED_SLOT)
    for b, first in enumerate(torch.tensor([0, *pages_per_seq]).cumsum(0)[:-1].tolist()):
        block_table[b, : pages_per_seq[b]] = order[first : first + pages_per_seq[b]]
    slot_table = paged_slot_table(block_table, page_size, max(lengths))
    k_store = torch.full((len(order) * page_size, num_kv_heads, D), float("nan"), dtype=dtype)
    v_store = k_store.clone()
    qs, seq_ids, positions = [], [], []
    for b, n in enumerate(lengths):
        slots = slot_table[b, :n]
        k_store[slots] = torch.randn(n, num_kv_heads, D, generator=g).to(dtype)
        v_store[slots] = torch.randn(n, num_kv_heads, D, generator=g).to(dtype)
        start = max(0, n - chunk)
        qs.append(torch.randn(n - start, num_heads, D, generator=g).to(dtype))
        seq_ids += [b] * (n - start)
        positions += range(start, n)
    return torch.cat(qs), k_store, v_store, slot_table, torch.tensor(seq_ids), torch.tensor(positions)


def assert_matches_reference(out, args, window, dtype):
    expected = reference_op(dtype)(*args, SCALE, window)
    assert out.dtype == dtype and out.shape == args[0].shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected.double(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (4, 1), (2, 2)])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("form", ["packed", "paged prefill", "paged decode"])
def test_both_paths_match_reference(path, dtype, num_heads, num_kv_heads, window, form):
    lengths = (1, 7, 23, 40)  # partial, exact and several pages
    if form == "packed":
        args = packed(lengths, num_heads, num_kv_heads, dtype)
    else:
        args = paged(lengths, num_heads, num_kv_heads, dtype, chunk=9 if form == "paged prefill" else 1)
    assert_matches_reference(PATHS[path](*args, SCALE, window), args, window, dtype)


@pytest.mark.parametrize("form", ["packed", "packed, undeclared", "paged prefill", "paged decode", "packed, windowed"])
def test_attention_picks_the_path_from_shapes_and_the_declared_layout(form, monkeypatch):
    """Decode (no more queries than sequences) runs per row; whole sequences the caller declares packed
    (`packed_len`, as the trainer does) in one padded call; prefill chunks, windows and a batch nobody
    declared packed per sequence. Nothing is rediscovered from the tensors."""
    lengths = (3, 17, 30)
    args = packed(lengths, 4, 2, torch.float32) if form.startswith("packed") else paged(lengths, 4, 2, torch.float32, 1 if form == "paged decode" else 6)
    window = 5 if form.endswith("windowed") else None
    packed_len = max(lengths) if form.startswith("packed") and form != "packed, undeclared" else None
    expected = {"packed": "packed", "paged decode": "per_row"}.get(form, "per_sequence")
    for name in ("_per_row", "packed", "_per_sequence"):
        if name.strip("_") != expected:
            monkeypatch.setattr(native, name, lambda *a, name=name: pytest.fail(f"{form} ran the {name} path"))
    assert_matches_reference(native_op(torch.float32)(*args, SCALE, window, packed_len), args, window, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (4, 1), (2, 2)])
def test_packed_sequences_match_reference_forward_and_backward(dtype, num_heads, num_kv_heads):
    """The trainer's layout in one padded causal call: values, and float64 gradients, as the reference's."""
    lengths = (1, 7, 23, 40)
    args = packed(lengths, num_heads, num_kv_heads, dtype)
    assert_matches_reference(native.packed(*args, SCALE, 40), args, None, dtype)
    q, k_store, v_store, *metadata = packed(lengths, num_heads, num_kv_heads, torch.float64)
    grads = []
    for op in (lambda *a: native.packed(*a, SCALE, 40), lambda *a: reference_op(torch.float64)(*a, SCALE, None)):
        leaves = [t.clone().requires_grad_() for t in (q, k_store, v_store)]
        op(*leaves, *metadata).square().sum().backward()
        grads.append([t.grad for t in leaves])
    for ours, theirs in zip(*grads):
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)


def test_a_declared_packed_batch_never_waits_on_the_device(monkeypatch):
    """The layout is the caller's declaration, not a check of the tensors: no value reaches the host."""
    args = packed((3, 5), 2, 1, torch.float32)
    expected = reference_op(torch.float32)(*args, SCALE, None)
    for name in ("tolist", "item", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, lambda *_, **__: pytest.fail("attention.native read a device value on the host"))
    out = native_op(torch.float32)(*args, SCALE, None, 5)
    monkeypatch.undo()
    torch.testing.assert_close(out, expected, atol=TOLERANCE[torch.float32], rtol=TOLERANCE[torch.float32])


@pytest.mark.parametrize("path", PATHS)
def test_row_without_visible_keys_is_zero(path):
    """Query positions 10 and 12 with a window of 3 see (7, 10] and (9, 12]: past the 4 keys of the table."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(4, 4, D, generator=g), torch.randn(4, 2, D, generator=g), torch.randn(4, 2, D, generator=g)
    q.requires_grad_()
    args = (q, k, v, torch.arange(4)[None].repeat(4, 1), torch.arange(4), torch.tensor([2, 10, 3, 12]))
    out = PATHS[path](*args, SCALE, 3)
    assert torch.equal(out[[1, 3]], torch.zeros(2, 4, D))
    assert_matches_reference(out.detach(), (q.detach(), *args[1:]), 3, torch.float32)
    out.square().sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("path", PATHS)
def test_gradients_match_reference_and_skip_poisoned_slots(path):
    """float64 gradients of q, k_store and v_store equal the reference's; unwritten (NaN) slots get 0."""
    args = paged((5, 12, 20), 4, 2, torch.float64, chunk=1 if path == "per_row" else 7)
    q, k_store, v_store, *metadata = args
    grads = []
    for op in (PATHS[path], lambda *a: reference_op(torch.float64)(*a)):
        leaves = [t.clone().requires_grad_() for t in (q, k_store, v_store)]
        op(*leaves, *metadata, SCALE, None).square().sum().backward()
        grads.append([t.grad for t in leaves])
    written = ~k_store[:, 0, 0].isnan()
    for ours, theirs in zip(*grads):
        assert torch.isfinite(ours).all()
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10)
    assert (grads[0][1][~written] == 0).all() and (grads[0][2][~written] == 0).all()


def test_per_row_path_never_waits_on_the_device(monkeypatch):
    """By construction: every way a tensor reaches the host (or a shape is data-dependent) raises."""
    args = paged((5, 12, 20, 33), 4, 2, torch.bfloat16, chunk=1)
    expected = reference_op(torch.bfloat16)(*args, SCALE, 8)

    def host_sync(*_, **__):
        raise AssertionError("attention.native's per-row path read a device value on the host")

    for name in ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "nonzero", "unique"):
        monkeypatch.setattr(torch.Tensor, name, host_sync)
    for name in ("nonzero", "unique", "equal"):
        monkeypatch.setattr(torch, name, host_sync)
    out = native_op(torch.bfloat16)(*args, SCALE, 8)
    monkeypatch.undo()
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_per_row_path_runs_under_cuda_sync_debug_mode():
    args = [t.cuda() for t in paged((5, 12, 20, 33), 4, 2, torch.bfloat16, chunk=1)]
    op = native_op(torch.bfloat16)
    op(*args, SCALE)  # first call: lazy initialisation may synchronise
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = op(*args, SCALE)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_matches_reference(out.cpu(), [t.cpu() for t in args], None, torch.bfloat16)
