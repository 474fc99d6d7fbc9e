"""gdn.conv: the reference against a float64 conv1d, its rows' bits across packed training, chunked
prefill and decode, the conv_state it leaves, its errors and gradients; native's decode form as the
control that must differ."""

import pytest
import torch
import torch.nn.functional as F

from conftest import bitwise_equal, int_view
from isoexec.ops.gdn.conv import causal_conv, native_causal_conv

D = 40  # not a power of two
NUM_SLOTS, SLOT, COMPANION_SLOT = 5, 3, 1
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
NAN = float("nan")


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def constants(dtype):
    return dict(input_dtype=_name(dtype), output_dtype=_name(dtype), weight_dtype=_name(dtype), accum_dtype="float32")


def inputs(total, width, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(total, D, generator=g).to(dtype), (torch.randn(D, width, generator=g) * 0.7).to(dtype)


def packed_positions(lengths):
    return torch.cat([torch.arange(n) for n in lengths])


def textbook(x, weight, lengths):
    """Each sequence through float64 F.conv1d, zero-padded on the left, then silu."""
    out, start = [], 0
    for n in lengths:
        seq = x[start : start + n].double().T[None]  # [1, D, n]
        z = F.conv1d(seq, weight.double()[:, None], padding=weight.shape[1] - 1, groups=D)[0, :, :n].T
        out.append(z * torch.sigmoid(z))
        start += n
    return torch.cat(out)


def stream(op, x, weight, chunks, dtype, companion=None):
    """One sequence in slot SLOT of a NaN-filled conv_state, fed in chunks of the given sizes; each call
    also carries one decode token of `companion` (slot COMPANION_SLOT) ahead of the chunk. -> (y, y_companion, conv_state)."""
    conv_state = torch.full((NUM_SLOTS, weight.shape[1] - 1, D), NAN, dtype=dtype)
    ys, ys_companion, start = [], [], 0
    for step, n in enumerate(chunks):
        rows, ids, positions = x[start : start + n], [SLOT] * n, list(range(start, start + n))
        if companion is not None:
            rows, ids, positions = torch.cat([companion[step : step + 1], rows]), [COMPANION_SLOT, *ids], [step, *positions]
        y = op(rows, weight, conv_state, torch.tensor(ids), torch.tensor(positions), **constants(dtype))
        if companion is not None:
            ys_companion.append(y[:1])
            y = y[1:]
        ys.append(y)
        start += n
    return torch.cat(ys), (torch.cat(ys_companion) if ys_companion else None), conv_state


def cycled(sizes, total):
    chunks = []
    while sum(chunks) < total:
        chunks.append(min(sizes[len(chunks) % len(sizes)], total - sum(chunks)))
    return chunks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [4, 3, 2])
def test_reference_matches_float64_conv1d(dtype, width):
    lengths = (5, 23, 1, 9)
    x, weight = inputs(sum(lengths), width, dtype)
    y = causal_conv(x, weight, None, None, packed_positions(lengths), **constants(dtype))
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), textbook(x, weight, lengths), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_rows_are_the_same_packed_chunked_and_decoded(dtype):
    """A 23-token sequence packed between two others (no state), as prefill chunks of 1, 3, 5, 7 tokens
    carried through a NaN-filled conv_state beside a decode stream in another slot, and token by token."""
    lengths, length = (6, 23, 11), 23
    x_all, weight = inputs(sum(lengths), 4, dtype)
    packed = causal_conv(x_all, weight, None, None, packed_positions(lengths), **constants(dtype))
    x, expected = x_all[6 : 6 + length], packed[6 : 6 + length]
    companion, expected_companion = x_all[29:], packed[29:]
    for chunks, beside in ((cycled([1, 3, 5, 7], length), companion), ([1] * length, None)):
        y, y_companion, conv_state = stream(causal_conv, x, weight, chunks, dtype, beside)
        assert torch.isfinite(y).all()
        assert bitwise_equal(y, expected), f"chunks {chunks}: {int((int_view(y) != int_view(expected)).sum())} elements differ"
        if y_companion is not None:
            assert bitwise_equal(y_companion, expected_companion[: len(chunks)])
        assert bitwise_equal(conv_state[SLOT], x[-3:])


def test_native_decode_form_differs_from_its_packed_form_in_bf16():
    """Native decodes by multiplying the window by the weight in bf16 — each of the W products rounded
    to bf16 — and summing, while F.conv1d over a run accumulates the products unrounded: a different
    op sequence by construction. Measured on this CPU: 272 of 920 bf16 outputs differ."""
    length, dtype = 23, torch.bfloat16
    x, weight = inputs(length, 4, dtype)
    packed = native_causal_conv(x, weight, None, None, torch.arange(length), **constants(dtype))
    decoded, _, conv_state = stream(native_causal_conv, x, weight, [1] * length, dtype)
    assert torch.isfinite(decoded).all()
    torch.testing.assert_close(decoded.double(), packed.double(), atol=2e-2, rtol=2e-2)
    assert not bitwise_equal(decoded, packed)
    assert bitwise_equal(conv_state[SLOT], x[-3:])


@pytest.mark.parametrize("op", [causal_conv, native_causal_conv], ids=["reference", "native"])
def test_conv_state_holds_the_last_inputs_and_short_runs_keep_older_ones(op):
    """Slot 2: a 5-token prefill, then a 2-token run (its oldest input comes from the state). Slot 0: two
    single tokens from position 0 (the state's negative positions are zero, not the NaN it started with).
    The slots no run names keep their NaN bits."""
    dtype, width = torch.float32, 4
    x, weight = inputs(9, width, dtype)
    a, b = x[:7], x[7:]
    conv_state = torch.full((4, width - 1, D), NAN, dtype=dtype)
    untouched = conv_state[[1, 3]].clone()
    zero = torch.zeros(1, D)
    op(torch.cat([a[:5], b[:1]]), weight, conv_state, torch.tensor([2] * 5 + [0]), torch.tensor([0, 1, 2, 3, 4, 0]), **constants(dtype))
    assert bitwise_equal(conv_state[2], a[2:5])
    assert bitwise_equal(conv_state[0], torch.cat([zero, zero, b[:1]]))
    op(torch.cat([b[1:], a[5:]]), weight, conv_state, torch.tensor([0, 2, 2]), torch.tensor([1, 5, 6]), **constants(dtype))
    assert bitwise_equal(conv_state[2], a[4:7])
    assert bitwise_equal(conv_state[0], torch.cat([zero, b]))
    assert bitwise_equal(conv_state[[1, 3]], untouched)


def _bad(change):
    x, weight = inputs(6, 4, torch.float32)
    args = dict(x=x, weight=weight, conv_state=torch.zeros(2, 3, D), state_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
                positions=torch.tensor([4, 5, 6, 0, 1, 2]))
    kwargs = constants(torch.float32)
    change(args, kwargs)
    return args, kwargs


@pytest.mark.parametrize("op", [causal_conv, native_causal_conv], ids=["reference", "native"])
@pytest.mark.parametrize("change, message", [
    (lambda a, k: a.update(x=a["x"].bfloat16()), "gdn.conv input must be float32"),
    (lambda a, k: k.update(weight_dtype="bfloat16"), "gdn.conv weight must be bfloat16"),
    (lambda a, k: a.update(conv_state=a["conv_state"].double()), "gdn.conv conv_state must be float32"),
    (lambda a, k: a.update(weight=a["weight"][:, None]), "gdn.conv: x must be"),
    (lambda a, k: a.update(weight=a["weight"][:-1]), "gdn.conv: x must be"),
    (lambda a, k: a.update(conv_state=torch.zeros(2, 2, D)), "gdn.conv: conv_state must be"),
    (lambda a, k: a.update(conv_state=None), "gdn.conv: without conv_state every run must start at position 0"),
    (lambda a, k: a.update(conv_state=None, state_ids=None), "gdn.conv: without conv_state every run must start at position 0"),
    (lambda a, k: a.update(state_ids=torch.tensor([0, 0, 0, 1, 1])), "gdn.conv: state_ids must be"),
    (lambda a, k: a.update(state_ids=torch.zeros(6, 1, dtype=torch.long)), "gdn.conv: state_ids must be"),
    (lambda a, k: a.update(state_ids=None), "gdn.conv: state_ids are required"),
    (lambda a, k: a.update(state_ids=torch.tensor([0, 0, 0, 2, 2, 2])), "gdn.conv: state_ids must lie in"),
    (lambda a, k: a.update(positions=torch.tensor([4, 5, 7, 0, 1, 2])), "gdn.conv: consecutive tokens of one slot"),
    (lambda a, k: a.update(state_ids=torch.tensor([0, 0, 1, 1, 0, 0]), positions=torch.tensor([4, 5, 0, 1, 6, 7])),
     "gdn.conv: a slot appears in two runs"),
    (lambda a, k: a.update(positions=torch.tensor([4.0, 5, 6, 0, 1, 2])), "gdn.conv: positions must be"),
    (lambda a, k: a.update(positions=torch.tensor([4, 5, 6, -1, 0, 1])), "gdn.conv: positions must be non-negative"),
])
def test_bad_input_is_refused(op, change, message):
    args, kwargs = _bad(change)
    with pytest.raises(ValueError, match="^" + message):
        op(**args, **kwargs)


def test_reference_gradients_match_float64_autograd():
    lengths = (3, 9, 1)
    x, weight = inputs(sum(lengths), 4, torch.float32)
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    x, weight = x.requires_grad_(), weight.requires_grad_()
    (causal_conv(x, weight, None, None, packed_positions(lengths), **constants(torch.float32)) * grad_out).sum().backward()
    x64, weight64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    (textbook(x64, weight64, lengths) * grad_out.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weight.grad.double(), weight64.grad, atol=1e-5, rtol=1e-5)
