"""rms_norm.gated (Gated DeltaNet's output norm): the reference against float64, its rows the same bits
in any batch (the battery admits it), and bad input refused in one line."""

import pytest
import torch
import torch.nn.functional as F

from isoexec.contract import Contract
from conftest import preset_dict
from isoexec.ops.rms_norm import gated
from isoexec.runtime.registry import REGISTRY
from isoexec.validate.battery import validate_entry

CASES = ["trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"]
CONSTANTS = dict(input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32", reduce_block=32, block_tree="balanced_binary",
                 tree="sequential")


def math(x, gate, weight, eps):
    x, gate, weight = x.double(), gate.double(), weight.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight * F.silu(gate)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_reference_and_native_match_float64(dtype, tol):
    g = torch.Generator().manual_seed(0)
    x, gate, weight = (torch.randn(*shape, generator=g).to(dtype) for shape in ((5, 3, 40), (5, 3, 40), (40,)))
    name = str(dtype).removeprefix("torch.")
    want = math(x, gate, weight, 1e-6)
    ref = gated.reference(x, gate, weight, 1e-6, **{**CONSTANTS, "input_dtype": name, "output_dtype": name})
    nat = gated.native(x, gate, weight, 1e-6, input_dtype=name, output_dtype=name)
    for out in (ref, nat):
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


def test_the_battery_admits_the_reference():
    data = preset_dict("tiny-dense")
    data["composition"].append({"region": "rms_norm.gated", "ops": ["gated_norm"], "cases": CASES,
                                "impl": {"id": "rms_norm.gated.reference", "version": 1}, "constants": CONSTANTS,
                                "discharge": {"method": "bitwise_equal_to", "case": "trainer_fwd"}})
    contract = Contract.from_dict(data)
    result = validate_entry(contract, contract.entry("rms_norm.gated", "trainer_fwd"), REGISTRY.probe("rms_norm.gated"), registry=REGISTRY,
                            device=torch.device("cpu"))
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == ("bfloat16", "float32") and result.trials > 50


def test_bad_input_is_refused():
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="rms_norm.gated: x and gate must share a shape"):
        gated.reference(x, x[:, :4], torch.zeros(8), 1e-6, **CONSTANTS)
    with pytest.raises(ValueError, match="rms_norm.gated gate must be bfloat16"):
        gated.reference(x, x.float(), torch.zeros(8), 1e-6, **CONSTANTS)
