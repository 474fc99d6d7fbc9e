"""A family added from outside (gelu_dense.py: a dense decoder with a plain GELU MLP) runs through the
engine, the trainer and the audit bitwise, with nothing of engine/, trainer/, audit/ or rl/ changed for
it; its control (a split-K linear) visibly does not."""

import pytest
import torch

import gelu_dense
from conftest import bitwise_equal
from controls import control_dict
from isoexec.audit import all_equal, run_audit
from isoexec.contract import Contract, fit_contract
from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
from isoexec.model import PRESETS, init_random, load, read_config, save
from isoexec.trainer import Trainer
from isoexec.validate import validate

SPEC = gelu_dense.gelu_spec(PRESETS["tiny-dense"].replace(dtype="float32"))


@pytest.fixture(scope="module")
def model():
    return init_random(SPEC, seed=3)


def test_the_family_builds_its_own_layers_and_ops(model):
    assert type(model.model.layers[0].mlp) is gelu_dense.GeluMLP
    assert {"gelu", "up_proj", "down_proj"} <= SPEC.ops and "gate_proj" not in SPEC.ops and "silu_mul" not in SPEC.ops
    fitted = fit_contract(gelu_dense.contract(), SPEC)
    assert list(fitted.entry(gelu_dense.REGION, "engine_decode").ops) == ["gelu"]
    assert fitted.entry("activation", "engine_decode") is None  # the SwiGLU op is not the model's
    assert "gate_proj" not in fitted.entry("linear", "trainer_fwd").ops


def test_gelu_reference_matches_float64():
    x = torch.randn(1000, dtype=torch.float64) * 4
    expected = torch.nn.functional.gelu(x, approximate="tanh")
    out = gelu_dense.gelu_reference(x.float(), input_dtype="float32", output_dtype="float32", compute_dtype="float32")
    assert (out.double() - expected).abs().max() < 1e-5


def test_checkpoint_round_trip_picks_the_family_by_architecture(model, tmp_path):
    save(model, tmp_path / "ckpt")
    assert read_config(tmp_path / "ckpt") == SPEC
    assert all(bitwise_equal(a, b) for a, b in zip(load(tmp_path / "ckpt").state_dict().values(), model.state_dict().values()))


def test_admission_battery_admits_the_gelu_region(tmp_path, monkeypatch):
    monkeypatch.setenv("ISOEXEC_HOME", str(tmp_path))
    report = validate(fit_contract(gelu_dense.contract(), SPEC), spec=SPEC, record=False)
    gelu = next(k for k in report["kernels"] if k["region"] == gelu_dense.REGION)
    assert gelu["status"] == "admitted" and report["rejected"] == 0


def _rollout_and_score(model, contract):
    contract = fit_contract(contract, SPEC)
    prompts = [[5, 17, 3, 99, 42, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3], list(range(40, 80))]
    params = SamplingParams(temperature=1.0, max_tokens=6, return_full_logprobs=True)
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, num_pages=32, prefill_chunk_size=5))
    completions = engine.generate(prompts, params, progress=False)
    rows = Trainer(model, contract).logprobs([c.prompt + c.token_ids for c in completions], micro_batch_tokens=4096)
    return [bitwise_equal(r[len(c.prompt) - 1 :], c.full_logprobs) for r, c in zip(rows, completions)]


def test_engine_and_trainer_agree_bitwise_and_the_control_does_not(model):
    assert all(_rollout_and_score(model, gelu_dense.contract()))
    control = Contract.from_dict(gelu_dense.contract_dict(control_dict("linear")))
    assert not all(_rollout_and_score(model, control))


def test_audit_is_bitwise_for_the_family(model):
    report = run_audit(model, fit_contract(gelu_dense.contract(), SPEC), requests=6, max_new_tokens=6, progress=False)
    assert all_equal(report) and report["tokens"] > 0
    control = Contract.from_dict(gelu_dense.contract_dict(control_dict("linear")))
    assert not all_equal(run_audit(model, fit_contract(control, SPEC), requests=6, max_new_tokens=6, progress=False))
