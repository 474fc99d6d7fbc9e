"""The Qwen3-MoE family: parity with transformers' own Qwen3MoeForCausalLM (its eager experts path) on
odd configs, both expert layouts of a checkpoint, clear errors for bad ones, and the engine, trainer
and audit bitwise under tiny-moe with the control visibly not."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import bitwise_equal, preset_dict
from controls import control_dict, control_moe_experts
from isoexec.audit import all_equal, run_audit
from isoexec.contract import Contract, fit_contract, load_preset
from isoexec.model import PRESETS, SpecError, dense_spec, init_random, load, read_config, save
from isoexec.model.families.qwen3_moe import moe_spec

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=320, hidden_size=72, intermediate_size=96, num_attention_heads=3, num_key_value_heads=1, head_dim=24,
            rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=256, tie_word_embeddings=False, dtype="float32")
# Experts not a power of two, top-k 1 and > 2, norm_topk_prob on and off, sparse step 2, a dense-only layer.
CONFIGS = {
    "5 experts top-3 normalised": dict(num_experts=5, num_experts_per_tok=3, moe_intermediate_size=40, norm_topk_prob=True),
    "7 experts top-1 unnormalised, sparse step 2": dict(num_experts=7, num_experts_per_tok=1, moe_intermediate_size=24,
                                                        norm_topk_prob=False, decoder_sparse_step=2),
    "6 experts top-2, layer 1 dense": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=(1,)),
}


def _spec(moe: dict, layers: int = 3):
    return moe_spec(dense_spec(architecture="Qwen3ForCausalLM", num_hidden_layers=layers, **BASE), **moe)


@pytest.mark.parametrize("name", CONFIGS)
def test_parity_with_transformers(tmp_path, name):
    from isoexec import parity

    directory = save(init_random(_spec(CONFIGS[name]), seed=3), tmp_path / "ckpt")
    report = parity.compare(directory, "float32", contract="tiny-moe", num_sequences=3, seq_len=24)
    assert report["architecture"] == "Qwen3MoeForCausalLM"
    assert report["passed"], report


def test_a_transformers_checkpoint_loads_in_either_expert_layout(tmp_path):
    spec = _spec(CONFIGS["5 experts top-3 normalised"])
    fused = save(init_random(spec, seed=4), tmp_path / "fused")
    tensors = load_file(str(fused / "model.safetensors"))
    split = {}
    for key, tensor in tensors.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            prefix = key.removesuffix(".gate_up_proj")
            for e, w in enumerate(tensor):
                gate, up = w.chunk(2)
                split[f"{prefix}.{e}.gate_proj.weight"], split[f"{prefix}.{e}.up_proj.weight"] = gate.clone(), up.clone()
        elif key.endswith("mlp.experts.down_proj"):
            prefix = key.removesuffix(".down_proj")
            for e, w in enumerate(tensor):
                split[f"{prefix}.{e}.down_proj.weight"] = w.clone()
        else:
            split[key] = tensor
    (tmp_path / "split").mkdir()
    (tmp_path / "split" / "config.json").write_text((fused / "config.json").read_text())
    save_file(split, str(tmp_path / "split" / "model.safetensors"))
    a, b = load(fused).state_dict(), load(tmp_path / "split").state_dict()
    assert a.keys() == b.keys() and all(bitwise_equal(a[k], b[k]) for k in a)
    assert read_config(fused) == spec

    del split["model.layers.0.mlp.experts.3.up_proj.weight"]
    save_file(split, str(tmp_path / "split" / "model.safetensors"))
    with pytest.raises(SpecError, match=r"missing \['model.layers.0.mlp.experts.3.up_proj.weight'\]"):
        load(tmp_path / "split")


def test_bad_configs_and_weights_name_the_field_or_key(tmp_path):
    directory = save(init_random(_spec(CONFIGS["6 experts top-2, layer 1 dense"]), seed=5), tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 9}))
    with pytest.raises(SpecError, match="num_experts_per_tok 9 exceeds num_experts 6"):
        read_config(directory)
    (directory / "config.json").write_text(json.dumps({**config, "scoring_func": "sparsemax"}))
    with pytest.raises(SpecError, match="scoring_func 'sparsemax'"):
        read_config(directory)
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["model.layers.0.mlp.gate.weight"] = tensors["model.layers.0.mlp.gate.weight"][:5]
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(SpecError, match=r"model.layers.0.mlp.gate.weight has shape \(5, 72\), expected \(6, 72\)"):
        load(directory)


@pytest.fixture(scope="module")
def tiny_moe():
    spec = PRESETS["tiny-moe"].replace(dtype="float32")
    return init_random(spec, seed=0), spec


def test_audit_is_bitwise_under_tiny_moe_and_the_controls_are_not(tiny_moe):
    model, spec = tiny_moe
    report = run_audit(model, fit_contract(load_preset("tiny-moe"), spec), requests=8, max_new_tokens=8, progress=False)
    assert all_equal(report) and report["tokens"] == 64
    for control in (Contract.from_dict(control_moe_experts(preset_dict("tiny-moe"))),
                    Contract.from_dict(control_dict("linear", preset="tiny-moe"))):
        assert not all_equal(run_audit(model, fit_contract(control, spec), requests=8, max_new_tokens=8, progress=False)), control.name


def test_ties_at_the_top_k_boundary_resolve_alike_in_engine_and_trainer(tiny_moe):
    """Experts 1 and 3 of every MoE layer share one gate row: each token scores them exactly alike, so
    wherever they straddle the top-2 boundary only the lower id may be chosen. The engine (prefill chunks
    and decode) and the trainer pick the same experts: every row bitwise, and the ties are really met at
    the boundary (a wrapper around the bound router, installed as the audit's tracer, counts them)."""
    model, spec = tiny_moe
    tied = init_random(spec, seed=0)
    with torch.no_grad():
        for layer in tied.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight[3] = layer.mlp.gate.weight[1]
    at_boundary = []

    class RouterRecorder:
        def wrap(self, ops, case):
            def router(*args, **kwargs):
                weights, ids = ops["router"](*args, **kwargs)
                assert not ((ids == 3).any(-1) & ~(ids == 1).any(-1)).any(), f"{case}: expert 3 chosen over its tie, expert 1"
                at_boundary.append(int((ids[:, -1] == 1).sum()))
                return weights, ids

            return {**ops, "router": router}

    report = run_audit(tied, fit_contract(load_preset("tiny-moe"), spec), requests=8, max_new_tokens=8, progress=False,
                       tracer=RouterRecorder())
    assert all_equal(report) and sum(at_boundary) > 0
