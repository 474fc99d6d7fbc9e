"""`isoexec audit`: the rollout and the trainer agree bit for bit under the contract, and the audit sees
the mismatch of a control contract whose linear or attention is batch-dependent by construction
(`controls.py`; native is no control: whether it mismatches on a CPU depends on the CPU and the library)."""

import json
import subprocess
import sys

import pytest

from conftest import isoexec_here
from controls import control_contract, control_dict, tie_gate_rows
from isoexec.audit import Tracer, all_equal, render, run_audit
from isoexec.contract import Contract, dump_json, load_preset
from isoexec.model import PRESETS, dense_fields, dense_spec, init_random, save
from isoexec.contract import fit_contract

KEYS = ("tokens", "bitwise_equal_tokens", "full_vocab_rows", "full_vocab_rows_bitwise_equal",
        "rollout_train_logprob_abs_diff_mean", "rollout_train_logprob_abs_diff_max", "k3_kl")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_token_and_row_is_bitwise_equal_under_the_contract_and_not_under_the_control(dtype):
    spec = PRESETS["tiny-dense"].replace(dtype=dtype)
    model = init_random(spec, seed=0)
    report = run_audit(model, fit_contract(load_preset("tiny-dense"), spec), progress=False)
    assert all_equal(report)
    assert report["tokens"] == 16 * 16 and report["bitwise_equal_tokens"] == report["tokens"]
    assert report["full_vocab_rows_bitwise_equal"] == report["full_vocab_rows"] == report["tokens"]
    assert report["rollout_train_logprob_abs_diff_max"] == 0.0 and report["k3_kl"] == 0.0
    assert report["engine"]["preemptions"] > 0 and report["engine"]["prefix_cache_hit_tokens"] > 0
    assert report["engine"]["prefill_chunks"] > 16  # long prompts were chunked
    assert report["routing_mismatch_tokens"] is None and report["trainer_fwd"]["routing_compared_tokens"] is None  # nothing routed
    assert "routing:" not in render(report)
    control = run_audit(model, fit_contract(control_contract("linear"), spec), progress=False, tracer=Tracer())
    assert not all_equal(control)
    assert control["bitwise_equal_tokens"] < control["tokens"] and control["rollout_train_logprob_abs_diff_max"] > 0
    assert control["trace"]["summary"]


def test_an_audit_over_attention_spans_is_bitwise_and_its_control_is_not():
    """split_kv_size 32 (spans of two 16-key blocks; the audit's rows run to ~150 keys): the engine's chunked prefill
    and decode and the trainer's packed rows combine the same spans in the same order. The control walks the spans
    in blocks twice as wide in calls of many queries."""
    spec = PRESETS["tiny-dense"]
    model = init_random(spec, seed=0)

    def with_spans(data):
        for entry in data["composition"]:
            if entry["region"] == "attention":
                entry["constants"]["split_kv_size"] = 32
        return Contract.from_dict(data)

    from conftest import preset_dict

    report = run_audit(model, fit_contract(with_spans(preset_dict("tiny-dense")), spec), progress=False)
    assert all_equal(report) and report["tokens"] == 16 * 16
    control = run_audit(model, fit_contract(with_spans(control_dict("attention")), spec), progress=False)
    assert not all_equal(control) and control["bitwise_equal_tokens"] < control["tokens"]


def test_an_moe_audit_counts_the_tokens_routed_to_other_experts():
    """Under tiny-moe every sampled token's row goes to the same experts in the engine and in both trainer
    cases. The control router (`controls.reversed_scan_moe_router`) breaks ties at the top-k boundary
    toward the higher expert id in calls of more than 16 tokens — the trainer's micro-batches, not the
    engine's decode steps — so on a model whose experts 1 and 3 share a gate row the audit must count
    tokens with another expert set."""
    spec = PRESETS["tiny-moe"].replace(dtype="float32")
    tied = tie_gate_rows(init_random(spec, seed=0))
    report = run_audit(tied, fit_contract(load_preset("tiny-moe"), spec), requests=8, max_new_tokens=8, progress=False)
    assert all_equal(report) and report["tokens"] == 64
    for case in ("trainer_score", "trainer_fwd"):
        assert report[case]["routing_mismatch_tokens"] == 0 and report[case]["routing_compared_tokens"] == 64
    assert report["routing_mismatch_tokens"] == 0 and report["routing_compared_tokens"] == 64
    assert "routing: 0/64 tokens with a different expert set" in render(report)
    control = Contract.from_dict(control_dict("moe.router", preset="tiny-moe"))
    drifted = run_audit(tied, fit_contract(control, spec), requests=8, max_new_tokens=8, progress=False)
    assert not all_equal(drifted)
    for case in ("trainer_score", "trainer_fwd"):
        assert 0 < drifted[case]["routing_mismatch_tokens"] < drifted[case]["routing_compared_tokens"] == 64
    assert f"routing: {drifted['routing_mismatch_tokens']}/64" in render(drifted)


def test_trace_names_the_first_diverging_region():
    spec = PRESETS["tiny-dense"].replace(dtype="float32")
    report = run_audit(init_random(spec, seed=0), fit_contract(control_contract("attention"), spec), progress=False, tracer=Tracer())
    trace = report["trace"]
    assert trace["region"] == "attention" and trace["op"] == "self_attn"
    assert trace["engine_digest"] != trace["trainer_digest"]


@pytest.mark.parametrize("fused,region", [(False, "residual"), (True, "rms_norm.residual")])
def test_trace_digests_both_outputs_of_a_norm_after_a_residual_add(fused, region):
    """(normed, residual stream): the stream is recorded first, as `<op>.residual`, and put on the region
    that computed it — the residual add where the norm is composed from it."""
    import torch

    from conftest import fused_norms, preset_dict
    from isoexec.model import PackedBatch, Step, current_step, step, tracing

    contract = fused_norms(preset_dict("tiny-dense"), "rms_norm.residual.reference") if fused else load_preset("tiny-dense")
    tracer, x = Tracer(), torch.ones(2, 4)
    for case, offset in (("engine_decode", 0.0), ("trainer_score", 1.0)):
        ops = {"norm": lambda x, residual, weight, eps, offset=offset: (x * weight, x + residual + offset)}
        labels = torch.tensor([(7 << 32) | 0, (7 << 32) | 1])
        current = Step(case=case, ops=ops, batch=PackedBatch.of([2], "cpu"), state=(), labels=labels)
        with tracing(tracer), step(current):
            current_step().ops["norm"](x, x, 2.0, 1e-6)
    assert [op for op, _ in tracer.records[(7 << 32) | 1]["engine_decode"]] == ["norm.residual", "norm"]
    explained = tracer.explain(7, 1, contract)
    assert explained["op"] == "norm.residual" and explained["region"] == region


def test_audit_command_json_and_exit_codes(tmp_path, capsys):
    """The command as a user's process once; native's measurement and the refusals through `main` in this one."""
    out = tmp_path / "audit.json"
    ok = subprocess.run([sys.executable, "-m", "isoexec", "audit", "--quiet", "--requests", "6", "--max-new-tokens", "5", "--json", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(out.read_text())
    assert set(KEYS) <= set(report) and set(report["contract"]) >= {"semantic", "numerical_policy", "deployment"}
    assert report["routing_mismatch_tokens"] is None  # a dense model: the key is there, null
    assert "bitwise equal" in ok.stdout
    native = isoexec_here(capsys, "audit", "--quiet", "--contract", "native", "--requests", "4", "--max-new-tokens", "4")
    assert native.returncode == 0 and "trainer_score" in native.stdout  # claims nothing: a measurement, whatever it finds
    for args, message in ((["--model", "tiny-sparse"], "neither a model preset"), (["--model", str(tmp_path)], "no config.json"),
                          (["--requests", "0"], "at least 1"), (["--contract", "nope.toml"], "no such file")):
        bad = isoexec_here(capsys, "audit", "--quiet", *args)
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_mismatch_under_a_contract_claiming_nothing_is_reported_and_exits_0(tmp_path, capsys):
    """In this process, where the control impls are registered: the command prints the mismatch and the
    trace, and exits 0 because the contract claims nothing."""
    from isoexec.cli import main

    path = tmp_path / "control.json"
    path.write_text(dump_json(control_contract("linear")), "utf-8")
    assert main(["audit", "--quiet", "--contract", str(path), "--requests", "4", "--max-new-tokens", "4", "--trace"]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "trace:" in out


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_audit_runs_on_a_checkpoint_directory(tmp_path, architecture, capsys):
    spec = dense_spec(**{**dense_fields(PRESETS["tiny-dense"]), "architecture": architecture, "hidden_size": 80, "num_key_value_heads": 1, "head_dim": 24, "tie_word_embeddings": False})
    save(init_random(spec, seed=7), tmp_path / "ckpt")
    result = isoexec_here(capsys, "audit", "--quiet", "--model", str(tmp_path / "ckpt"), "--requests", "6", "--max-new-tokens", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert architecture in result.stdout and "bitwise equal" in result.stdout
