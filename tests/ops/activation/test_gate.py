"""activation.gate (the gated attention's output gate): reference and native against float64, the
reference's rows the same bits in any batch (the battery admits it), bad input refused in one line."""

import pytest
import torch

from conftest import preset_dict
from isoexec.contract import Contract
from isoexec.ops.activation import gate
from isoexec.runtime.registry import REGISTRY
from isoexec.validate.battery import validate_entry

CASES = ["trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
def test_reference_and_native_match_float64(dtype, tol):
    g = torch.Generator().manual_seed(0)
    x, z = (torch.randn(7, 40, generator=g).mul(4).to(dtype) for _ in range(2))
    name = str(dtype).removeprefix("torch.")
    want = x.double() * torch.sigmoid(z.double())
    for out in (gate.reference(x, z, input_dtype=name, output_dtype=name, compute_dtype="float32"),
                gate.native(x, z, input_dtype=name, output_dtype=name)):
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


def test_the_battery_admits_the_reference():
    data = preset_dict("tiny-dense")
    data["composition"].append({"region": "activation.gate", "ops": ["attn_gate"], "cases": CASES,
                                "impl": {"id": "activation.gate.reference", "version": 1},
                                "constants": dict(input_dtype="bfloat16", output_dtype="bfloat16", compute_dtype="float32"),
                                "discharge": {"method": "bitwise_equal_to", "case": "trainer_fwd"}})
    contract = Contract.from_dict(data)
    result = validate_entry(contract, contract.entry("activation.gate", "trainer_fwd"), REGISTRY.probe("activation.gate"), registry=REGISTRY,
                            device=torch.device("cpu"))
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == ("bfloat16", "float32") and result.trials > 100


def test_bad_input_is_refused():
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="activation.gate: x and gate must share a shape"):
        gate.reference(x, x[:, :4], input_dtype="bfloat16", output_dtype="bfloat16", compute_dtype="float32")
