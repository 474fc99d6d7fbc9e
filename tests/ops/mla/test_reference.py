"""mla.reference: the MLA function (against float64 decompressed softmax attention, values and
gradients), the same bits for a row in every form (packed training, prefill chunks, decode steps over
a poisoned paged store), native's two forms visibly not, the admission battery, and bad input."""

import functools

import pytest
import torch

from conftest import preset_dict
from isoexec.contract import Contract
from isoexec.ops.attention.metadata import UNUSED_SLOT, packed_slot_table, paged_slot_table
from isoexec.ops.mla import probe
from isoexec.runtime.registry import REGISTRY, ResolutionError
from isoexec.validate.battery import validate_entry

H, NOPE, ROPE, RANK, VALUE = 4, 16, 8, 32, 16
SCALE = (NOPE + ROPE) ** -0.5
INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}
CASES = ["trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"]


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def reference_constants(dtype=torch.float32, accum_dtype="float32", block_n=16, block=16):
    name = _name(dtype)
    return dict(input_dtype=name, output_dtype=name, kv_cache_dtype=name, weight_dtype=name, accum_dtype=accum_dtype, block_n=block_n,
                reduce_block=block, block_tree="balanced_binary", block_k=block, tree="sequential", split_kv_size=0)


def reference_op(dtype=torch.float32, **kwargs):
    return REGISTRY.get("mla.reference", 1).bind(reference_constants(dtype, **kwargs))


def native_op(dtype=torch.float32):
    return REGISTRY.get("mla.native", 1).bind(dict(input_dtype=_name(dtype), output_dtype=_name(dtype)))


def bits(t):
    return t.detach().contiguous().view(INT_VIEW[t.dtype])


def make_weight(dtype=torch.float32, num_heads=H, nope=NOPE, rank=RANK, value=VALUE, seed=9):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_heads * (nope + value), rank, generator=g) * rank**-0.5).to(dtype)


def make_seqs(lengths, dtype=torch.float32, num_heads=H, nope=NOPE, rope=ROPE, rank=RANK, seed=0):
    """One (q_nope [L, H, dn], q_rope [L, H, dr], rows [L, r + dr]) per length."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(*shape, generator=g).to(dtype) for shape in ((n, num_heads, nope), (n, num_heads, rope), (n, rank + rope)))
            for n in lengths]


def math_mla(q_nope, q_rope, rows, weight, scale=SCALE):
    """Textbook float64 MLA of one sequence: keys and values decompressed, causal softmax -> [L, H, dv]."""
    q_nope, q_rope, rows, weight = (t.double() for t in (q_nope, q_rope, rows, weight))
    num_heads, nope = q_nope.shape[1:]
    rank = weight.shape[1]
    w = weight.view(num_heads, -1, rank)
    k_nope = torch.einsum("hdr,jr->jhd", w[:, :nope], rows[:, :rank])
    v = torch.einsum("hvr,jr->jhv", w[:, nope:], rows[:, :rank])
    scores = (torch.einsum("ihd,jhd->hij", q_nope, k_nope) + torch.einsum("ihd,jd->hij", q_rope, rows[:, rank:])) * scale
    causal = torch.arange(rows.shape[0])[None, :] <= torch.arange(q_nope.shape[0])[:, None]
    return torch.einsum("hij,jhv->ihv", torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1), v)


def run_packed(op, seqs, weight):
    """All sequences packed back to back in one call, the store being their own rows -> one output per sequence."""
    lengths = [q.shape[0] for q, _, _ in seqs]
    slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, *lengths]).cumsum(0))
    q_nope, q_rope, rows = (torch.cat(parts) for parts in zip(*seqs))
    return list(op(q_nope, q_rope, rows, weight, slot_table, seq_ids, positions, SCALE, max(lengths)).split(lengths))


class PagedStore:
    """Pages of `page_size` slots handed out in shuffled order; every slot is NaN until written."""

    def __init__(self, seqs, page_size=16, seed=1):
        pages_per_seq = [-(-q.shape[0] // page_size) for q, _, _ in seqs]
        order = torch.randperm(sum(pages_per_seq) + 1, generator=torch.Generator().manual_seed(seed))
        block_table = torch.full((len(seqs), max(pages_per_seq)), UNUSED_SLOT)
        for b, first in enumerate(torch.tensor([0, *pages_per_seq]).cumsum(0)[:-1].tolist()):
            block_table[b, : pages_per_seq[b]] = order[first : first + pages_per_seq[b]]
        self.seqs = seqs
        self.slot_table = paged_slot_table(block_table, page_size, block_table.shape[1] * page_size)
        self.rows = torch.full((len(order) * page_size, seqs[0][2].shape[1]), float("nan"), dtype=seqs[0][2].dtype)

    def step(self, op, weight, spans):
        """One engine call: spans are (sequence, start, stop) query ranges, written to the store first."""
        for b, start, stop in spans:
            self.rows[self.slot_table[b, start:stop]] = self.seqs[b][2][start:stop]
        q_nope = torch.cat([self.seqs[b][0][start:stop] for b, start, stop in spans])
        q_rope = torch.cat([self.seqs[b][1][start:stop] for b, start, stop in spans])
        seq_ids = torch.cat([torch.full((stop - start,), b) for b, start, stop in spans])
        positions = torch.cat([torch.arange(start, stop) for _, start, stop in spans])
        out = op(q_nope, q_rope, self.rows, weight, self.slot_table, seq_ids, positions, SCALE)
        return out.split([stop - start for _, start, stop in spans])


def run_prefill(op, seqs, weight, chunk):
    store, pieces = PagedStore(seqs), [[] for _ in seqs]
    for start in range(0, max(q.shape[0] for q, _, _ in seqs), chunk):
        spans = [(b, start, min(start + chunk, q.shape[0])) for b, (q, _, _) in enumerate(seqs) if start < q.shape[0]]
        for (b, _, _), out in zip(spans, store.step(op, weight, spans)):
            pieces[b].append(out)
    return [torch.cat(p) for p in pieces]


def run_decode(op, seqs, weight):
    return run_prefill(op, seqs, weight, 1)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("form", ["packed", "prefill in chunks of 7", "decode"])
def test_matches_float64_decompressed_attention(dtype, tol, form):
    lengths = (1, 7, 16, 23, 40)  # partial, exact and several key blocks
    seqs, weight = make_seqs(lengths, dtype), make_weight(dtype)
    run = {"packed": run_packed, "prefill in chunks of 7": functools.partial(run_prefill, chunk=7), "decode": run_decode}[form]
    for (q_nope, q_rope, rows), out in zip(seqs, run(reference_op(dtype), seqs, weight)):
        assert out.dtype == dtype and out.shape == (q_nope.shape[0], H, VALUE)
        torch.testing.assert_close(out.double(), math_mla(q_nope, q_rope, rows, weight), atol=tol, rtol=tol)


def test_value_width_may_differ_from_the_key_widths():
    """DeepSeek-V3's shape class: dn = 2 dv, dr = dv / 2, r a multiple of neither block."""
    seqs = make_seqs((5, 19), nope=12, rope=4, rank=20)
    weight = make_weight(nope=12, rank=20, value=6)
    for (q_nope, q_rope, rows), out in zip(seqs, run_packed(reference_op(), seqs, weight)):
        torch.testing.assert_close(out.double(), math_mla(q_nope, q_rope, rows, weight, SCALE), atol=2e-6, rtol=2e-6)


def test_gradients_match_float64_autograd_of_the_math():
    """q_nope, q_rope, the latent rows and kv_b_weight, through the absorbed GEMMs and the block walk."""
    op = reference_op(torch.float64, accum_dtype="float64", block_n=4, block=4)
    lengths = (3, 9)
    seqs, weight = make_seqs(lengths, torch.float64, num_heads=2, nope=4, rope=2, rank=6), make_weight(torch.float64, 2, 4, 6, 3)
    leaves = [torch.cat(parts).requires_grad_() for parts in zip(*seqs)] + [weight.clone().requires_grad_()]
    grads = []
    for run in ("reference", "math"):
        q_nope, q_rope, rows, w = leaves
        if run == "reference":
            slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, 3, 12]))
            out = op(q_nope, q_rope, rows, w, slot_table, seq_ids, positions, SCALE, 9)
        else:
            parts = zip(*(t.split(lengths) for t in (q_nope, q_rope, rows)))
            out = torch.cat([math_mla(*part, w) for part in parts])
        grads.append(torch.autograd.grad(out.square().sum(), leaves))
    for name, ours, theirs in zip(("q_nope", "q_rope", "rows", "kv_b_weight"), *grads):
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=1e-10, msg=name)


def test_gradient_never_sees_poisoned_slots():
    seqs, weight = make_seqs((21,)), make_weight().requires_grad_()
    store = PagedStore(seqs)
    store.step(lambda *args: torch.zeros(21, H, VALUE), weight, [(0, 0, 21)])  # write the rows only
    q_nope, q_rope = (t.clone().requires_grad_() for t in seqs[0][:2])
    rows = store.rows.clone().requires_grad_()
    out = reference_op()(q_nope, q_rope, rows, weight, store.slot_table, torch.zeros(21, dtype=torch.int64), torch.arange(21), SCALE)
    out.square().sum().backward()
    written = torch.zeros(rows.shape[0], dtype=torch.bool)
    written[store.slot_table[0, :21]] = True
    assert all(torch.isfinite(t.grad).all() for t in (q_nope, q_rope, weight))
    assert torch.isfinite(rows.grad[written]).all() and (rows.grad[~written] == 0).all()


def forms(op, dtype):
    """The target sequence (length 37) computed in every form; the first is the sequence alone."""
    (target,), others = make_seqs((37,), dtype, seed=3), make_seqs((16, 5, 50), dtype, seed=4)
    weight = make_weight(dtype)
    yield "alone", run_packed(op, [target], weight)[0]
    for count in (1, 2, 3):
        yield f"packed after {count} others", run_packed(op, [*others[:count], target], weight)[count]
    yield "packed first of 4", run_packed(op, [target, *others], weight)[0]
    for chunk in (16, 32, 5, 37):
        yield f"prefill in chunks of {chunk}", run_prefill(op, [target, *others], weight, chunk)[0]
    yield "prefill alone", run_prefill(op, [target], weight, 37)[0]
    yield "decode among others", run_decode(op, [*others, target], weight)[-1]
    yield "decode alone", run_decode(op, [target], weight)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_bitwise_equal_in_every_form(dtype):
    results = dict(forms(reference_op(dtype), dtype))
    alone = results.pop("alone")
    assert torch.isfinite(alone).all()
    for form, out in results.items():
        assert torch.equal(bits(out), bits(alone)), form


def test_native_differs_between_its_decode_and_prefill_forms():
    """The same comparison under mla.native, bf16: its decode steps take the absorbed form (q_lat = W_UKᵀ
    q_nope rounded to bf16), everything else the decompressed one (k_nope = W_UK c rounded to bf16).
    Those roundings sit at different points of the arithmetic, so most outputs differ on any CPU or
    BLAS: no batch-dependence of a library is needed to see it."""
    results = dict(forms(native_op(torch.bfloat16), torch.bfloat16))
    alone = results.pop("alone")
    for form in ("decode alone", "decode among others"):
        out = results[form]
        torch.testing.assert_close(out.float(), alone.float(), atol=5e-2, rtol=5e-2)  # the same function ...
        assert (bits(out) != bits(alone)).float().mean() > 0.2, form  # ... in other bits


def mla_contract(impl="mla.reference", constants=None) -> Contract:
    """tiny-dense with an `mla` entry pinning `impl` in every case (discharged against trainer_fwd)."""
    data = preset_dict("tiny-dense")
    data["composition"].append({"region": "mla", "ops": ["mla_attn"], "cases": CASES, "impl": {"id": impl, "version": 1},
                                "constants": constants or reference_constants(torch.bfloat16),
                                "discharge": {"method": "bitwise_equal_to", "case": "trainer_fwd"}})
    return Contract.from_dict(data)


def test_battery_admits_the_reference_and_rejects_native():
    contract = mla_contract()
    admitted = validate_entry(contract, contract.entry("mla", "trainer_fwd"), REGISTRY.probe("mla"), registry=REGISTRY,
                              device=torch.device("cpu"))
    assert admitted.status == "admitted", admitted.failures[:5]
    assert admitted.dtypes == ("bfloat16", "float32") and admitted.trials > 200
    contract = mla_contract("mla.native", dict(input_dtype="bfloat16", output_dtype="bfloat16"))
    rejected = validate_entry(contract, contract.entry("mla", "trainer_fwd"), REGISTRY.probe("mla"), registry=REGISTRY,
                              device=torch.device("cpu"))
    assert rejected.status == "rejected"
    assert not any("raised" in failure for failure in rejected.failures), rejected.failures[:5]
    # Its decode steps (absorbed) against the trainer's rows (decompressed): different by construction.
    assert any(failure.startswith("bfloat16: engine_decode") for failure in rejected.failures)


def test_probe_runs_at_a_fitted_models_widths():
    """`ctx.geometry["mla"]` replaces the probe's own widths, all of the model's heads included."""
    geometry = {"mla": dict(num_heads=8, qk_nope_head_dim=12, qk_rope_head_dim=6, kv_lora_rank=20, v_head_dim=10)}
    seen = []

    def recording(*args, **kwargs):
        seen.append((tuple(args[0].shape[1:]), tuple(args[1].shape[1:]), args[2].shape[1], tuple(args[3].shape)))
        return REGISTRY.get("mla.reference", 1).fn(*args, **kwargs)

    from isoexec.runtime.registry import Impl, Registry

    registry = Registry()
    registry.register(Impl(id="mla.reference", version=1, region="mla", cases=REGISTRY.get("mla.reference", 1).cases, fn=recording))
    contract = mla_contract()
    small_probe = functools.partial(probe.probe, lengths=(17, 1))
    result = validate_entry(contract, contract.entry("mla", "trainer_fwd"), small_probe, registry=registry, device=torch.device("cpu"),
                            dtypes=("bfloat16",), geometry=geometry)
    assert result.status == "admitted", result.failures[:5]
    assert set(seen) == {((8, 12), (8, 6), 26, (8 * 22, 20))}


def _call(op, q_nope, q_rope, rows, weight, **kwargs):
    n = q_nope.shape[0]
    args = dict(slot_table=torch.arange(rows.shape[0])[None], seq_ids=torch.zeros(n, dtype=torch.int64), positions=torch.arange(n))
    args.update(kwargs)
    return op(q_nope, q_rope, rows, weight, args["slot_table"], args["seq_ids"], args["positions"], SCALE)


BAD_SHAPES = {
    "heads of q_rope": (lambda q, r, c, w: (q, r[:, :2], c, w), "q_nope and q_rope must be"),
    "a 3-D latent store": (lambda q, r, c, w: (q, r, c[:, None], w), "latent_store must be"),
    "a latent store without latent columns": (lambda q, r, c, w: (q, r, c[:, :ROPE], w), "latent_store must be"),
    "kv_b_weight of another rank": (lambda q, r, c, w: (q, r, c, w[:, :-1]), "kv_b_weight must be"),
    "kv_b_weight rows not a multiple of the heads": (lambda q, r, c, w: (q, r, c, w[:-1]), "not 4 heads of dn \\+ dv"),
    "kv_b_weight without value rows": (lambda q, r, c, w: (q, r, c, w[: H * NOPE]), "not 4 heads of dn \\+ dv"),
}


@pytest.mark.parametrize("impl", ["reference", "native"])
@pytest.mark.parametrize("bad", BAD_SHAPES)
def test_bad_shapes_raise_one_line(impl, bad):
    edit, message = BAD_SHAPES[bad]
    (q_nope, q_rope, rows), = make_seqs((3,))
    with pytest.raises(ValueError, match=message) as error:
        _call(reference_op() if impl == "reference" else native_op(), *edit(q_nope, q_rope, rows, make_weight()))
    assert "\n" not in str(error.value)


def test_bad_dtypes_and_metadata_raise_one_line():
    (q_nope, q_rope, rows), = make_seqs((3,), torch.bfloat16)
    weight, op = make_weight(torch.bfloat16), reference_op(torch.bfloat16)
    cases = [
        ((q_nope.float(), q_rope, rows, weight), {}, "mla q_nope must be bfloat16"),
        ((q_nope, q_rope.float(), rows, weight), {}, "mla q_rope must be bfloat16"),
        ((q_nope, q_rope, rows.float(), weight), {}, "mla latent_store must be bfloat16"),
        ((q_nope, q_rope, rows, weight.float()), {}, "mla kv_b_weight must be bfloat16"),
        ((q_nope, q_rope, rows, weight), {"seq_ids": torch.zeros(2, dtype=torch.int64)}, "3 queries but 2 seq_ids"),
        ((q_nope, q_rope, rows, weight), {"positions": torch.arange(3.0)}, "positions must be a 1-D integer tensor"),
        ((q_nope, q_rope, rows, weight), {"slot_table": torch.tensor([[0, 1, 7]])}, "outside the key/value store"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            _call(op, *args, **kwargs)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="mla q_nope must be bfloat16"):
        _call(native_op(torch.bfloat16), q_nope.float(), q_rope, rows, weight)


def test_split_kv_is_refused_at_resolve_time():
    with pytest.raises(ResolutionError, match="split_kv_size must be 0"):
        REGISTRY.resolve(mla_contract(constants={**reference_constants(torch.bfloat16), "split_kv_size": 64}))


def test_empty_query_batch():
    (q_nope, q_rope, rows), = make_seqs((5,))
    empty = torch.empty(0, dtype=torch.int64)
    for op in (reference_op(), native_op()):
        out = op(q_nope[:0], q_rope[:0], rows, make_weight(), torch.arange(5)[None], empty, empty, SCALE)
        assert out.shape == (0, H, VALUE) and out.dtype == torch.float32
