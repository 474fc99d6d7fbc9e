"""The dense family reads Qwen3, Qwen2, Llama and MiMo checkpoints; MiMo's multi-token-prediction
layers are read past with one logged line, never silently."""

import json
import logging

import torch
from safetensors.torch import load_file, save_file

from conftest import bitwise_equal
from isoexec.model import PRESETS, dense_fields, dense_spec, init_random, load, read_config, save

QWEN2 = dense_spec(**{**dense_fields(PRESETS["tiny-dense"]), "architecture": "Qwen2ForCausalLM", "dtype": "float32"})


def _mimo_checkpoint(tmp_path):
    """A Qwen2 checkpoint turned into MiMo's layout: its config says MiMoForCausalLM with one MTP layer,
    and its weights carry that layer's tensors."""
    directory = save(init_random(QWEN2, seed=1), tmp_path / "mimo")
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["MiMoForCausalLM"], model_type="mimo", num_nextn_predict_layers=1)
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(directory / "model.safetensors"))
    tensors |= {"model.mtp_layers.0.input_layernorm.weight": torch.ones(64), "model.mtp_layers.0.token_layernorm.weight": torch.ones(64),
                "model.mtp_layers.0.input_proj.weight": torch.zeros(64, 128)}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def test_mimo_loads_as_qwen2_and_says_what_it_ignored(tmp_path, caplog):
    directory = _mimo_checkpoint(tmp_path)
    spec = read_config(directory)
    assert spec.family == "dense" and spec.architecture == "MiMoForCausalLM"
    assert spec.layers == QWEN2.layers  # q/k/v bias, no q/k norm, as Qwen2
    with caplog.at_level(logging.WARNING, logger="isoexec"):
        mimo = load(directory)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "ignored 3 checkpoint tensors under model.mtp_layers." in lines[0]
    qwen2 = init_random(QWEN2, seed=1)
    assert mimo.state_dict().keys() == qwen2.state_dict().keys()
    assert all(bitwise_equal(a, b) for a, b in zip(mimo.state_dict().values(), qwen2.state_dict().values()))
    assert spec.to_hf_config()["num_nextn_predict_layers"] == 1


def test_other_unexpected_keys_are_still_refused(tmp_path):
    directory = save(init_random(QWEN2, seed=1), tmp_path / "qwen2")
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["model.mtp_layers.0.input_proj.weight"] = torch.zeros(64, 128)  # not MiMo: nothing is ignored
    save_file(tensors, str(directory / "model.safetensors"))
    try:
        load(directory)
    except ValueError as error:
        assert "unexpected ['model.mtp_layers.0.input_proj.weight']" in str(error)
    else:
        raise AssertionError("a Qwen2 checkpoint with extra tensors loaded")


def test_every_layer_is_gqa_attention_and_a_swiglu_mlp():
    spec = PRESETS["qwen3-0.6b-random"]
    assert spec.num_hidden_layers == 28 and len(set(spec.layers)) == 1
    layer = spec.layers[0]
    assert (layer.mixer.kind, layer.ffn.kind) == ("gqa", "mlp") and layer.mixer.qk_norm
    assert spec.projections["q_proj"] == {(2048, 1024): 28} and spec.projections["lm_head"] == {(151936, 1024): 1}
