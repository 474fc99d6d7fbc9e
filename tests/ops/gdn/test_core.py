"""gdn.core: the chunk-form rows (CPR) against a float64 textbook recurrence, bit for bit the same in a
packed training batch, in prefill chunks cut anywhere and in decode from every offset of a chunk, over a
NaN-poisoned cache; native's two forms (chunk form for runs, the recurrent step for decode) visibly not;
gradients against float64; bad input refused in one line."""

import functools

import pytest
import torch
import torch.nn.functional as F

from conftest import bitwise_equal, int_view
from isoexec.ops.gdn import native, reference

C = 8  # chunk size of the tests: sequences cross several chunks in few tokens
HK, HV, DK, DV = 2, 4, 8, 6  # value heads > key heads
REDUCE = dict(reduce_block=4, block_tree="balanced_binary", tree="sequential")


def constants(dtype=torch.float32, accum="float32"):
    name = str(dtype).removeprefix("torch.")
    return dict(input_dtype=name, output_dtype=name, accum_dtype=accum, chunk_size=C, **REDUCE)


def op(impl="reference", dtype=torch.float32, accum="float32"):
    if impl == "reference":
        return functools.partial(reference.gdn_core, **constants(dtype, accum))
    return functools.partial(native.gdn_core, input_dtype=constants(dtype)["input_dtype"], output_dtype=constants(dtype)["output_dtype"],
                             chunk_size=C)


def make_seq(length, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = dict(q=(length, HK, DK), k=(length, HK, DK), v=(length, HV, DV), a=(length, HV), b=(length, HV))
    return {name: torch.randn(*shape, generator=g).to(dtype) for name, shape in shapes.items()}


def make_params(seed=1):
    g = torch.Generator().manual_seed(seed)
    return dict(a_log=torch.randn(HV, generator=g) * 0.5, dt_bias=torch.randn(HV, generator=g) * 0.5)


def textbook(seq, params):
    """The gated delta rule one token at a time in float64 (transformers' recurrent formulation)."""
    q, k, v, a, b = (seq[n].double() for n in "qkvab")
    g = -params["a_log"].double().exp() * F.softplus(a + params["dt_bias"].double())
    beta = b.sigmoid()
    q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() * DK**-0.5
    k = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    q, k = q.repeat_interleave(HV // HK, 1), k.repeat_interleave(HV // HK, 1)
    state, out = torch.zeros(HV, DK, DV, dtype=torch.float64), []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        delta = (v[t] - (state * k[t][:, :, None]).sum(1)) * beta[t][:, None]
        state = state + k[t][:, :, None] * delta[:, None, :]
        out.append((state * q[t][:, :, None]).sum(1))
    return torch.stack(out)


def packed(fn, seqs, params):
    """All sequences in one trainer-style call (no cache) -> one output per sequence."""
    lengths = [s["q"].shape[0] for s in seqs]
    cat = {n: torch.cat([s[n] for s in seqs]) for n in seqs[0]}
    positions = torch.cat([torch.arange(n) for n in lengths])
    return list(fn(**cat, **params, positions=positions).split(lengths))


class Cache:
    """An engine-style cache of `slots` sequences, NaN-filled (no slot has been written)."""

    def __init__(self, slots=3):
        self.state = torch.full((slots, HV, DK, DV), float("nan"))
        self.rows = torch.full((slots, C, HV, reference.row_width(HV, DK, DV)), float("nan"))

    def step(self, fn, params, spans):
        """spans: (slot, seq, start, stop) runs in one call -> their outputs."""
        cat = {n: torch.cat([seq[n][start:stop] for _, seq, start, stop in spans]) for n in "qkvab"}
        state_ids = torch.cat([torch.full((stop - start,), slot) for slot, _, start, stop in spans])
        positions = torch.cat([torch.arange(start, stop) for _, _, start, stop in spans])
        out = fn(**cat, **params, state=self.state, rows=self.rows, state_ids=state_ids, positions=positions)
        return out.split([stop - start for _, _, start, stop in spans])


def in_pieces(fn, seq, params, cuts, slot=1):
    """`seq` run through the cache in calls cut at `cuts`, next to another sequence in each call."""
    length, pieces, bounds = seq["q"].shape[0], [], [0, *cuts, seq["q"].shape[0]]
    cache, other = Cache(), make_seq(len(bounds), seq["q"].dtype, seed=7)  # one neighbour token a call
    for n, (start, stop) in enumerate(zip(bounds, bounds[1:])):
        if start == stop:
            continue
        other_span = (0, other, n, n + 1)  # the neighbour decodes one token a call
        mine = cache.step(fn, params, [other_span, (slot, seq, start, stop)])[1]
        pieces.append(mine)
    assert sum(p.shape[0] for p in pieces) == length
    return torch.cat(pieces)


LENGTHS = (1, C - 1, C, C + 1, 3 * C + 5)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_rows_match_the_float64_recurrence(dtype, tol):
    seqs, params = [make_seq(n, dtype, seed=n) for n in LENGTHS], make_params()
    for seq, out in zip(seqs, packed(op("reference", dtype), seqs, params)):
        want = textbook(seq, params)
        assert out.dtype == dtype and out.shape == want.shape
        assert (out.double() - want).abs().max() < tol * max(1.0, float(want.abs().max()))


def test_native_matches_the_float64_recurrence_in_both_forms():
    seq, params = make_seq(3 * C + 5), make_params()
    want = textbook(seq, params)
    for out in (packed(op("native"), [seq], params)[0], in_pieces(op("native"), seq, params, range(1, 3 * C + 5))):
        torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=2e-6)


def forms(fn, dtype, length=3 * C + 5):
    """The target sequence's rows in every form: packed alone, packed after others, prefill chunks cut
    at chunk boundaries, mid-chunk and at random, decode token by token (every offset of a chunk)."""
    seq, params = make_seq(length, dtype, seed=3), make_params()
    others = [make_seq(n, dtype, seed=10 + n) for n in (5, C + 2)]
    yield "alone", packed(fn, [seq], params)[0]
    yield "packed after others", packed(fn, [*others, seq], params)[2]
    yield "prefill at chunk boundaries", in_pieces(fn, seq, params, [cut for cut in (C, 2 * C, 3 * C) if cut < length])
    yield "prefill chunks of 5", in_pieces(fn, seq, params, range(5, length, 5))
    yield "prefill mid-chunk then decode", in_pieces(fn, seq, params, [C + 3, *range(C + 4, length)])
    yield "decode then prefill", in_pieces(fn, seq, params, [1, 2, 3, C + 2, C + 3])
    yield "decode", in_pieces(fn, seq, params, range(1, length))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_form_gives_the_trainers_bits(dtype):
    results = dict(forms(op("reference", dtype), dtype))
    first = results["alone"]
    differing = {form: int((int_view(out) != int_view(first)).sum()) for form, out in results.items() if not bitwise_equal(out, first)}
    assert not differing


def test_native_decode_is_not_the_trainers_bits():
    """The control: native's recurrent step and chunk form are different op sequences (a running state
    updated token by token against the UT transform solved per chunk), so decoded rows differ."""
    results = dict(forms(op("native"), torch.float32))
    assert not bitwise_equal(results["decode"], results["alone"])


def test_the_cache_holds_the_chunk_start_state_and_the_open_rows():
    """After a prefill of 2C + 3 tokens the slot's state is the state after 2 whole chunks (as a call of
    2C tokens leaves it) and its first 3 rows are the open chunk's, as decoding the tokens one by one
    writes them; the other slots are untouched."""
    seq, params = make_seq(2 * C + 3), make_params()
    cache, closed, decoded = Cache(), Cache(), Cache()
    cache.step(op(), params, [(2, seq, 0, 2 * C + 3)])
    closed.step(op(), params, [(0, seq, 0, 2 * C)])
    for t in range(2 * C + 3):
        decoded.step(op(), params, [(1, seq, t, t + 1)])
    assert bitwise_equal(cache.state[2], closed.state[0]) and bitwise_equal(cache.state[2], decoded.state[1])
    assert bitwise_equal(cache.rows[2, :3], decoded.rows[1, :3])
    assert torch.isnan(cache.state[:2]).all() and torch.isnan(cache.rows[:2]).all()


def test_a_new_sequence_ignores_what_its_slot_held():
    seq, params = make_seq(C + 2), make_params()
    cache = Cache()
    cache.state.fill_(1e30)
    cache.rows.fill_(float("inf"))
    out = cache.step(op(), params, [(0, seq, 0, C + 2)])[0]
    assert bitwise_equal(out, packed(op(), [seq], params)[0])


def test_gradients_match_float64_autograd_of_the_recurrence():
    seqs, params = [make_seq(n, seed=n) for n in (C + 3, 5)], make_params()
    leaves = [{n: t.double().requires_grad_() for n, t in s.items()} for s in seqs]
    p64 = {n: t.double().requires_grad_() for n, t in params.items()}
    out = packed(op(dtype=torch.float64, accum="float64"), leaves, p64)
    (sum((o * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum() for o in out)).backward()
    got = [t.grad.clone() for s in leaves for t in s.values()] + [t.grad.clone() for t in p64.values()]
    for t in [*[t for s in leaves for t in s.values()], *p64.values()]:
        t.grad = None
    want_out = [textbook(s, p64) for s in leaves]
    (sum((o * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum() for o in want_out)).backward()
    want = [t.grad for s in leaves for t in s.values()] + [t.grad for t in p64.values()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("change, message", [
    (dict(q=torch.zeros(3, HK, DK, dtype=torch.bfloat16)), "gdn.core q must be float32"),
    (dict(v=torch.zeros(3, 3, DV)), "not a multiple"),
    (dict(a=torch.zeros(3, HV + 1)), "a must be [T, Hv]"),
    (dict(positions=torch.arange(1, 4)), "starts at position 0"),
    (dict(state=torch.zeros(1, HV, DK, DV)), "come together"),
])
def test_bad_input_is_refused_in_one_line(change, message):
    args = {**make_seq(3), **make_params(), "positions": torch.arange(3), **change}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        op()(**args)
