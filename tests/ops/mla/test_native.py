"""mla.native's forms (absorbed per row for decode, decompressed packed or per sequence otherwise)
compute MLA: values against float64 decompressed attention, gradients in float64, poison kept out,
the path picked from shapes and the declared layout, and the decode path without host syncs."""

import functools

import pytest
import torch

from isoexec.ops.attention.metadata import packed_slot_table
from isoexec.ops.mla import native

from .test_reference import H, SCALE, VALUE, PagedStore, make_seqs, make_weight, math_mla, native_op, run_decode, run_packed, run_prefill

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 5e-2}
FORMS = {"packed": run_packed, "prefill in chunks of 9": functools.partial(run_prefill, chunk=9), "decode": run_decode}
PATH_OF_FORM = {"packed": "_packed", "prefill in chunks of 9": "_per_sequence", "decode": "_absorbed"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", FORMS)
def test_every_form_matches_float64_attention_and_takes_its_path(dtype, form, monkeypatch):
    lengths = (1, 7, 23, 41)  # partial, exact and several pages; every prefill step has more queries than sequences
    seqs, weight = make_seqs(lengths, dtype), make_weight(dtype)
    for name in PATH_OF_FORM.values():
        if name != PATH_OF_FORM[form]:
            monkeypatch.setattr(native, name, lambda *a, name=name: pytest.fail(f"{form} ran the {name} path"))
    for (q_nope, q_rope, rows), out in zip(seqs, FORMS[form](native_op(dtype), seqs, weight)):
        assert out.dtype == dtype and out.shape == (q_nope.shape[0], H, VALUE) and torch.isfinite(out).all()
        expected = math_mla(q_nope, q_rope, rows, weight)
        torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_a_packed_batch_nobody_declared_runs_per_sequence(monkeypatch):
    seqs, weight = make_seqs((3, 17, 30)), make_weight()
    lengths = [q.shape[0] for q, _, _ in seqs]
    slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, *lengths]).cumsum(0))
    monkeypatch.setattr(native, "_packed", lambda *a: pytest.fail("an undeclared batch ran the packed path"))
    out = native_op()(*(torch.cat(parts) for parts in zip(*seqs)), weight, slot_table, seq_ids, positions, SCALE)
    for (q_nope, q_rope, rows), part in zip(seqs, out.split(lengths)):
        torch.testing.assert_close(part.double(), math_mla(q_nope, q_rope, rows, weight), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("form", FORMS)
def test_gradients_match_float64_autograd_of_the_math(form):
    """float64 gradients of q_nope, q_rope, the rows and kv_b_weight; unwritten (NaN) slots get 0."""
    lengths = (3, 9, 12)
    seqs, weight = make_seqs(lengths, torch.float64), make_weight(torch.float64).requires_grad_()
    seqs = [tuple(t.requires_grad_() for t in seq) for seq in seqs]
    out = torch.cat(FORMS[form](native_op(torch.float64), seqs, weight))
    leaves = [t for seq in seqs for t in seq] + [weight]
    ours = torch.autograd.grad(out.square().sum(), leaves)
    theirs = torch.autograd.grad(torch.cat([math_mla(*seq, weight) for seq in seqs]).square().sum(), leaves)
    for got, expected in zip(ours, theirs):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


def test_decode_path_never_waits_on_the_device(monkeypatch):
    """By construction: every way a tensor reaches the host (or a shape is data-dependent) raises."""
    seqs, weight = make_seqs((5, 12, 20, 33), torch.bfloat16), make_weight(torch.bfloat16)
    store = PagedStore(seqs)
    spans = [(b, q.shape[0] - 1, q.shape[0]) for b, (q, _, _) in enumerate(seqs)]
    for b, (q, _, rows) in enumerate(seqs):
        store.rows[store.slot_table[b, : q.shape[0]]] = rows
    args = [torch.cat([seqs[b][i][start:stop] for b, start, stop in spans]) for i in (0, 1)]
    seq_ids, positions = torch.arange(4), torch.tensor([stop - 1 for _, _, stop in spans])

    def host_sync(*_, **__):
        raise AssertionError("mla.native's decode path read a device value on the host")

    for name in ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "nonzero", "unique"):
        monkeypatch.setattr(torch.Tensor, name, host_sync)
    for name in ("nonzero", "unique", "equal"):
        monkeypatch.setattr(torch, name, host_sync)
    out = native_op(torch.bfloat16)(*args, store.rows, weight, store.slot_table, seq_ids, positions, SCALE)
    monkeypatch.undo()
    expected = torch.stack([math_mla(*seq, weight)[-1] for seq in seqs])
    torch.testing.assert_close(out.double(), expected, atol=5e-2, rtol=5e-2)
