import pytest
import torch

from conftest import run_battery
from controls import CONTROLS, control_contract

from isoexec.contract.files import load_preset
from isoexec.ops.logprobs import reference
from isoexec.runtime.registry import REGISTRY
from isoexec.validate.battery import validate_entry

CONSTANTS = {"output_dtype": "float32", "accum_dtype": "float32", "vocab_block": 256, "block_tree": "balanced_binary",
             "leaf_tree": "balanced_binary"}
FLOAT64 = {"input_dtype": "float64", "output_dtype": "float64", "accum_dtype": "float64", "vocab_block": 64,
           "block_tree": "balanced_binary", "leaf_tree": "sequential"}
INF = float("inf")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def logits(rows: int, width: int, scale: float = 4.0, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width, generator=g) * scale).to(dtype)


def ref(x: torch.Tensor) -> torch.Tensor:
    return reference.logprobs(x, input_dtype=str(x.dtype).removeprefix("torch."), **CONSTANTS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 255, 300, 1000, 4096])
def test_matches_float64_log_softmax(dtype, width):
    x = logits(9, width, dtype=dtype)
    out = ref(x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    expected = torch.log_softmax(x.double(), -1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=2e-6)


def test_leading_dims_are_rows():
    x = logits(6, 300).reshape(2, 3, 300)
    assert torch.equal(bits(ref(x)), bits(ref(x.reshape(6, 300))).reshape(2, 3, 300))


def test_gradcheck_float64():
    x = logits(3, 150, scale=2.0, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: reference.logprobs(t, **FLOAT64), (x,))


def test_gradient_with_masked_entries_matches_torch():
    x = logits(4, 300, dtype=torch.float64)
    x[1, ::3] = -INF
    x[2, 100:] = -INF
    weights = logits(4, 300, seed=1, dtype=torch.float64)
    ours = x.clone().requires_grad_()
    theirs = x.clone().requires_grad_()
    (torch.where(x.isinf(), 0.0, reference.logprobs(ours, **FLOAT64)) * weights).sum().backward()
    (torch.where(x.isinf(), 0.0, torch.log_softmax(theirs, -1)) * weights).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)


def test_bf16_input_gets_bf16_gradient():
    x = logits(2, 300, dtype=torch.bfloat16).requires_grad_()
    ref(x).sum().backward()
    assert x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad).all()


def test_masked_entries_are_minus_inf_and_the_rest_renormalised():
    x = logits(3, 600)
    mask = torch.zeros_like(x, dtype=torch.bool)
    mask[0, ::2] = True
    mask[1, 256:] = True  # whole trailing blocks
    mask[2, :-1] = True  # one live token
    out = ref(x.masked_fill(mask, -INF))
    assert torch.equal(out[mask], torch.full_like(out[mask], -INF))
    for row in range(3):
        live = ~mask[row]
        torch.testing.assert_close(out[row, live].double(), torch.log_softmax(x[row, live].double(), -1), rtol=1e-6, atol=2e-6)
    assert out[2, -1].item() == 0.0


def test_all_minus_inf_row_is_minus_inf_and_its_gradient_finite():
    x = logits(3, 300)
    x[1] = -INF
    x.requires_grad_()
    out = ref(x)
    assert torch.equal(out[1], torch.full((300,), -INF))
    assert not out.isnan().any()
    out[torch.isfinite(out)].sum().backward()
    assert torch.isfinite(x.grad).all()


def test_nan_and_plus_inf_poison_only_their_row():
    x = logits(4, 300)
    clean = ref(x)
    x[1, 17] = float("nan")
    x[2, 3] = INF
    out = ref(x)
    assert out[1].isnan().all() and out[2].isnan().all()
    assert torch.equal(bits(out[[0, 3]]), bits(clean[[0, 3]]))


def test_token_logprobs_is_an_exact_gather():
    full = ref(logits(8, 300))
    tokens = torch.tensor([0, 299, 5, 5, 17, 256, 1, 100])
    picked = reference.token_logprobs(full, tokens)
    assert picked.shape == (8,)
    assert torch.equal(bits(picked), bits(full[torch.arange(8), tokens]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_alone_equal_rows_in_batches(dtype):
    x = logits(70, 1000, dtype=dtype)
    alone = torch.cat([ref(x[i : i + 1]) for i in range(70)])
    for size in (2, 7, 16, 33, 64, 70):
        for start in (0, 70 - size):
            assert torch.equal(bits(ref(x[start : start + size])), bits(alone[start : start + size])), (size, start)
    wide = torch.full((70, 2000), float("nan"), dtype=dtype)
    wide[:, ::2] = x
    assert torch.equal(bits(ref(wide[:, ::2])), bits(alone))


def test_a_batch_dependent_vocab_block_is_caught():
    """The negative control of the test above: vocabulary blocks chosen from the row count. (Native
    log_softmax cannot serve: whether ATen's CPU kernel reduces a row the same way in every batch is a
    property of the build and the CPU, not something to rely on either way.)"""
    x = logits(70, 1000)
    control = CONTROLS["logprobs"].bind(load_preset("tiny-dense").entry("logprobs", "trainer_fwd").constants | {"input_dtype": "float32"})
    alone = torch.cat([control(x[i : i + 1]) for i in range(70)])
    assert not torch.equal(bits(control(x)), bits(alone))


def test_reference_constants_bind_through_the_registry():
    entry = load_preset("tiny-dense").entry("logprobs", "engine_decode")
    op = REGISTRY.get(entry.impl.id, entry.impl.version).bind(entry.constants)
    out = op(logits(2, 300, dtype=torch.bfloat16))
    assert out.dtype == torch.float32
    with pytest.raises(ValueError, match="input"):
        op(logits(2, 300))


def battery(preset: str):
    return run_battery(preset, "logprobs", "trainer_fwd")


def test_battery_admits_the_reference():
    result = battery("tiny-dense")
    assert result.status == "admitted", result.failures
    assert result.impl == "logprobs.reference@1"
    assert result.dtypes == ("bfloat16", "float32") and result.trials > 0


def test_battery_rejects_a_batch_dependent_vocab_block():
    control = control_contract("logprobs")
    result = validate_entry(control, control.entry("logprobs", "trainer_fwd"), REGISTRY.probe("logprobs"), registry=REGISTRY,
                            device=torch.device("cpu"))
    assert result.impl == "control.row_count_logprobs@1" and result.status == "rejected"
