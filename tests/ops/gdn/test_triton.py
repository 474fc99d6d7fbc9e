"""gdn.core.triton: values against the float64 recurrence, bit for bit the same packed, in prefill chunks
cut anywhere and in decode from every offset of a chunk over a NaN-poisoned cache, native's pair of forms
visibly not; gradients (through native's chunk form) against float64; the battery's admission; bad
constants refused. Without a GPU the kernel runs in Triton's interpreter (tests/ops/linear/test_triton.py
has why TRITON_INTERPRET must be set before `triton` is imported), where bf16 is compared by tolerance
only (the interpreter truncates fp32 -> bf16)."""

import functools

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, bitwise_equal, int_view, preset_dict, require_triton

require_triton()

from isoexec.contract import Contract  # noqa: E402
from isoexec.ops.gdn import reference  # noqa: E402
from isoexec.ops.gdn import triton as gdn_triton  # noqa: E402
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


def triton_op(dtype=torch.float32):
    name = str(dtype).removeprefix("torch.")
    return on_device(functools.partial(gdn_triton.gdn_core, input_dtype=name, output_dtype=name, accum_dtype="float32", chunk_size=C,
                                       num_warps=4))


class DeviceCache(test_core.Cache):
    """test_core's cache where the kernel runs, so that it writes the slots the next call reads."""

    def __init__(self, slots=3):
        super().__init__(slots)
        self.state, self.rows = self.state.to(DEVICE), self.rows.to(DEVICE)


@pytest.fixture
def chunks_of_16(monkeypatch):
    """test_core's helpers (its Cache, packed and forms) with this file's chunk size, the cache on DEVICE."""
    monkeypatch.setattr(test_core, "C", C)
    monkeypatch.setattr(test_core, "Cache", DeviceCache)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
def test_rows_match_the_float64_recurrence(chunks_of_16, dtype, tol):
    seqs, params = [make_seq(n, dtype, seed=n) for n in (1, C - 1, C, C + 1, 3 * C + 5)], make_params()
    for seq, out in zip(seqs, test_core.packed(triton_op(dtype), seqs, params)):
        want = textbook(seq, params)
        assert out.dtype == dtype and out.shape == want.shape
        assert (out.double() - want).abs().max() < tol * max(1.0, float(want.abs().max()))


def test_every_form_gives_the_trainers_bits(chunks_of_16):
    """A sequence over two chunks, packed alone and after others, prefill at the chunk boundary, in chunks
    of 5, mid-chunk then decode, decode from every offset: one op sequence a row, so the same bits (fp32:
    the interpreter's bf16 is not the GPU's)."""
    results = dict(test_core.forms(triton_op(), torch.float32, length=C + 5))
    first = results["alone"]
    differing = {form: int((int_view(out) != int_view(first)).sum()) for form, out in results.items() if not bitwise_equal(out, first)}
    assert not differing
    assert torch.isfinite(first).all()


def test_the_cache_matches_the_references_layout(chunks_of_16):
    """After a prefill of 2C + 3 tokens the slot holds S₀ after two chunks and three open rows, close to
    what the reference keeps (both are the same quantities, in another order of operations)."""
    seq, params = make_seq(2 * C + 3), make_params()
    caches = {}
    reference_op = on_device(functools.partial(reference.gdn_core, input_dtype="float32", output_dtype="float32", accum_dtype="float32",
                                               chunk_size=C, **test_core.REDUCE))
    for name, fn in (("triton", triton_op()), ("reference", reference_op)):
        cache = test_core.Cache()
        cache.step(fn, params, [(2, seq, 0, 2 * C + 3)])
        caches[name] = cache
    torch.testing.assert_close(caches["triton"].state[2].cpu(), caches["reference"].state[2].cpu(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches["triton"].rows[2, :3].cpu(), caches["reference"].rows[2, :3].cpu(), atol=1e-5, rtol=1e-5)
    assert torch.isnan(caches["triton"].rows[2, 3:].cpu()).all() and torch.isnan(caches["triton"].state[:2].cpu()).all()


def test_gradients_match_float64_autograd_of_the_recurrence(chunks_of_16):
    seq, params = make_seq(C + 5, seed=2), make_params()
    leaves = {n: t.clone().requires_grad_() for n, t in seq.items()}
    out = triton_op()(**leaves, **params, positions=torch.arange(C + 5))
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weights).sum().backward()
    exact = {n: t.double().requires_grad_() for n, t in seq.items()}
    (textbook(exact, params) * weights.double()).sum().backward()
    for name in seq:
        torch.testing.assert_close(leaves[name].grad.double(), exact[name].grad, atol=1e-5, rtol=1e-4)


def test_the_battery_admits_it():
    """In the interpreter, the probe's forms and hazards at two short sequences (C + 1 and 5 carry its
    hazards; the interpreter runs every program of the (token, head) grid in numpy), fp32 only; on a GPU
    the full probe in both dtype passes."""
    data = preset_dict("tiny-dense")
    data["composition"].append({"region": "gdn.core", "ops": ["gdn_core"], "cases": ["trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"],
                                "impl": {"id": "gdn.core.triton", "version": 1},
                                "constants": dict(input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32", chunk_size=C,
                                                  num_warps=4),
                                "discharge": {"method": "bitwise_equal_to", "case": "trainer_fwd"}})
    contract = Contract.from_dict(data)
    probe = REGISTRY.probe("gdn.core") if ON_GPU else functools.partial(REGISTRY.probe("gdn.core"), lengths=(C + 1, 5))
    dtypes = ("bfloat16", "float32") if ON_GPU else ("float32",)  # the interpreter's bf16 is not the GPU's
    result = validate_entry(contract, contract.entry("gdn.core", "trainer_fwd"), probe, registry=REGISTRY, device=DEVICE, dtypes=dtypes)
    assert result.status == "admitted", result.failures[:5]


@pytest.mark.parametrize("changes, message", [
    (dict(accum_dtype="float64"), "accumulates in float32 only"),
    (dict(chunk_size=8), "chunk_size must be a power of two >= 16"),
    (dict(num_warps=3), "num_warps must be a power of two"),
])
def test_bad_constants_are_refused(changes, message):
    constants = {**dict(input_dtype="float32", output_dtype="float32", accum_dtype="float32", chunk_size=C, num_warps=4), **changes}
    with pytest.raises(ValueError, match=message):
        gdn_triton.check_constants(constants)
