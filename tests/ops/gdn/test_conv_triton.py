"""gdn.conv.triton: values against a float64 conv1d, bit for bit the same packed, in prefill chunks beside a
decode stream and token by token over a NaN-poisoned conv_state; the state it leaves; the reference's
one-line errors; gradients (through the reference) against float64; the battery's admission. Without a
GPU the kernels run in Triton's interpreter (tests/ops/linear/test_triton.py has why TRITON_INTERPRET
must be set before `triton` is imported)."""

import functools

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, bitwise_equal, int_view, require_triton

require_triton()

from isoexec.ops.gdn import conv_triton  # noqa: E402
from isoexec.runtime.registry import REGISTRY  # noqa: E402
from isoexec.validate.battery import validate_entry  # noqa: E402

from . import test_conv  # noqa: E402
from .test_conv import SLOT, constants, cycled, inputs, packed_positions, stream, textbook  # noqa: E402
from .test_probe import CONV, gdn_contract  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]


def op(x, weight, conv_state, state_ids, positions, **kwargs):
    """conv_triton.causal_conv on DEVICE; a conv_state is moved there and back so the test sees its update."""
    on = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    state = on(conv_state)
    y = conv_triton.causal_conv(on(x), on(weight), state, on(state_ids), on(positions), **kwargs)
    if conv_state is not None:
        conv_state.copy_(state.cpu())
    return y.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_match_float64_conv1d(dtype):
    lengths = (5, 23, 1, 9)
    x, weight = inputs(sum(lengths), 4, dtype)
    y = op(x, weight, None, None, packed_positions(lengths), **constants(dtype))
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), textbook(x, weight, lengths), atol=test_conv.TOLERANCE[dtype], rtol=test_conv.TOLERANCE[dtype])


def test_rows_are_the_same_packed_chunked_and_decoded():
    """fp32 (the interpreter's bf16 is not the GPU's): a 23-token sequence packed between two others, as
    prefill chunks of 1, 3, 5, 7 beside a decode stream in another slot, and token by token."""
    dtype, lengths, length = torch.float32, (6, 23, 11), 23
    x_all, weight = inputs(sum(lengths), 4, dtype)
    packed = op(x_all, weight, None, None, packed_positions(lengths), **constants(dtype))
    x, expected = x_all[6 : 6 + length], packed[6 : 6 + length]
    companion, expected_companion = x_all[29:], packed[29:]
    for chunks, beside in ((cycled([1, 3, 5, 7], length), companion), ([1] * length, None)):
        y, y_companion, conv_state = stream(op, x, weight, chunks, dtype, beside)
        assert torch.isfinite(y).all()
        assert bitwise_equal(y, expected), f"chunks {chunks}: {int((int_view(y) != int_view(expected)).sum())} elements differ"
        if y_companion is not None:
            assert bitwise_equal(y_companion, expected_companion[: len(chunks)])
        assert bitwise_equal(conv_state[SLOT], x[-3:])


def test_conv_state_holds_the_last_inputs_and_short_runs_keep_older_ones():
    test_conv.test_conv_state_holds_the_last_inputs_and_short_runs_keep_older_ones(op)


@pytest.mark.parametrize("change, message", [
    (lambda a, k: a.update(state_ids=torch.tensor([0, 0, 0, 2, 2, 2])), "gdn.conv: state_ids must lie in"),
    (lambda a, k: a.update(positions=torch.tensor([4, 5, 7, 0, 1, 2])), "gdn.conv: consecutive tokens of one slot"),
    (lambda a, k: a.update(conv_state=None), "gdn.conv: without conv_state every run must start at position 0"),
    (lambda a, k: a.update(state_ids=torch.tensor([0, 0, 1, 1, 0, 0]), positions=torch.tensor([4, 5, 0, 1, 6, 7])),
     "gdn.conv: a slot appears in two runs"),
    (lambda a, k: a.update(positions=torch.tensor([4, 5, 6, -1, 0, 1])), "gdn.conv: positions must be non-negative"),
    (lambda a, k: k.update(accum_dtype="float64"), "gdn.conv.triton accumulates in float32 only"),
])
def test_bad_input_is_refused(change, message):
    """The reference's refusals, their values read from the host's copy of the runs (gdn/runs.py)."""
    args, kwargs = test_conv._bad(change)
    with pytest.raises(ValueError, match="^" + message):
        op(**args, **kwargs)


def test_gradients_match_float64_autograd():
    lengths = (3, 9, 1)
    x, weight = inputs(sum(lengths), 4, torch.float32)
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    x, weight = x.to(DEVICE).requires_grad_(), weight.to(DEVICE).requires_grad_()
    y = conv_triton.causal_conv(x, weight, None, None, packed_positions(lengths).to(DEVICE), **constants(torch.float32))
    (y * grad_out.to(DEVICE)).sum().backward()
    x64, weight64 = x.detach().cpu().double().requires_grad_(), weight.detach().cpu().double().requires_grad_()
    (textbook(x64, weight64, lengths) * grad_out.double()).sum().backward()
    torch.testing.assert_close(x.grad.cpu().double(), x64.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weight.grad.cpu().double(), weight64.grad, atol=1e-5, rtol=1e-5)


def test_the_battery_admits_it():
    """The conv probe's lengths and hazards; in the interpreter fp32 only and three of its lengths."""
    contract = gdn_contract("gdn.conv", "gdn.conv.triton", CONV)
    probe = REGISTRY.probe("gdn.conv") if ON_GPU else functools.partial(REGISTRY.probe("gdn.conv"), lengths=(17, 1, 5))
    dtypes = ("bfloat16", "float32") if ON_GPU else ("float32",)
    result = validate_entry(contract, contract.entry("gdn.conv", "trainer_fwd"), probe, registry=REGISTRY, device=DEVICE, dtypes=dtypes)
    assert result.status == "admitted", result.failures[:5]
