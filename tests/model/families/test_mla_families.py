"""The MLA + MoE families (DeepSeek-V3, GLM-4.7-Flash): parity with transformers' own models (eager
attention and experts) on odd tiny configs, checkpoints in either expert layout with their MTP layers
ignored, clear errors for bad configs, and the engine (prefill chunks, decode) and trainer bitwise under
tiny-mla, with the two-form native MLA visibly not."""

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import bitwise_equal, preset_dict
from isoexec.audit import all_equal, run_audit
from isoexec.contract import Contract, fit_contract, load_preset
from isoexec.model import PRESETS, SpecError, from_hf_config, init_random, load, read_config, save
from isoexec.model.families import deepseek_v3

transformers = pytest.importorskip("transformers")

GLM = "Glm4MoeLiteForCausalLM"
# q_lora_rank set and null, rope_interleave on and off, n_group > 1, experts not a power of two, top-k 1 and 3.
CONFIGS = {
    "deepseek-v3, q_lora 24, interleaved rope, 8 experts in 4 groups keep 2, top-3": dict(
        n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, q_lora_rank=24),
    "deepseek-v3, q_proj (no q_lora), rope not interleaved, 6 experts in 2 groups, top-1, unnormalised": dict(
        n_routed_experts=6, num_experts_per_tok=1, n_group=2, topk_group=1, q_lora_rank=None, rope_interleave=False, norm_topk_prob=False),
    "deepseek-v3, yarn rope (factor 4, mscale 1 on every dim), 8 experts in 2 groups": dict(
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "glm-4.7-flash, 5 experts top-2, two shared experts, layers dense/sparse/dense": dict(
        architectures=[GLM], n_routed_experts=5, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=2,
        mlp_layer_types=["dense", "sparse", "dense"]),
    "glm-4.7-flash, q_proj, rope not interleaved, first dense by default": dict(
        architectures=[GLM], n_routed_experts=6, num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=None, rope_interleave=False),
}
SMALL = dict(vocab_size=320, hidden_size=72, intermediate_size=96, num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=40,
             qk_nope_head_dim=20, qk_rope_head_dim=12, v_head_dim=24, moe_intermediate_size=40, max_position_embeddings=256,
             torch_dtype="float32")


def _config(name: str) -> dict:
    config = deepseek_v3.tiny_config(**{**SMALL, **CONFIGS[name]})
    if config["architectures"] == [GLM]:
        config.pop("first_k_dense_replace")
    return config


@pytest.mark.parametrize("name, dtype", [(name, "float32") for name in CONFIGS] + [(next(iter(CONFIGS)), "bfloat16")])
def test_parity_with_transformers(tmp_path, name, dtype):
    from isoexec import parity

    spec = from_hf_config(_config(name))
    directory = save(init_random(spec, seed=3), tmp_path / "ckpt")
    report = parity.compare(directory, dtype, contract="tiny-mla", num_sequences=3, seq_len=24)
    assert report["architecture"] == spec.architecture
    assert report["passed"], report


def test_the_config_round_trips_and_a_checkpoint_loads_in_either_expert_layout_with_mtp_ignored(tmp_path, caplog):
    name = "deepseek-v3, q_lora 24, interleaved rope, 8 experts in 4 groups keep 2, top-3"
    spec = from_hf_config({**_config(name), "num_nextn_predict_layers": 1})
    fused = save(init_random(spec, seed=4), tmp_path / "fused")
    assert read_config(fused) == spec
    tensors = load_file(str(fused / "model.safetensors"))
    split = {}
    for key, tensor in tensors.items():
        if key.endswith("mlp.experts.gate_up_proj"):
            prefix = key.removesuffix(".gate_up_proj")
            for e, w in enumerate(tensor):
                split[f"{prefix}.{e}.gate_proj.weight"], split[f"{prefix}.{e}.up_proj.weight"] = (t.clone() for t in w.chunk(2))
        elif key.endswith("mlp.experts.down_proj"):
            for e, w in enumerate(tensor):
                split[f"{key.removesuffix('.down_proj')}.{e}.down_proj.weight"] = w.clone()
        else:
            split[key] = tensor
    # The MTP layer is stored after the last one (layer 3 of 3); it must be read past, not loaded.
    split["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)
    split["model.layers.3.self_attn.kv_b_proj.weight"] = torch.zeros(4, 4)
    (tmp_path / "split").mkdir()
    (tmp_path / "split" / "config.json").write_text((fused / "config.json").read_text())
    save_file(split, str(tmp_path / "split" / "model.safetensors"))
    with caplog.at_level(logging.WARNING):
        loaded = load(tmp_path / "split").state_dict()
    assert [r.message for r in caplog.records if "ignored 2 checkpoint tensors under model.layers.3." in r.message]
    a = load(fused).state_dict()
    assert a.keys() == loaded.keys() and all(bitwise_equal(a[k], loaded[k]) for k in a)
    assert loaded["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32


def test_a_checkpoint_transformers_wrote_loads_and_matches(tmp_path):
    """transformers' own save_pretrained (its key names and layouts), every parameter randomised."""
    from isoexec import parity

    config = transformers.AutoConfig.for_model("glm4_moe_lite", **{k: v for k, v in _config(
        "glm-4.7-flash, 5 experts top-2, two shared experts, layers dense/sparse/dense").items() if k not in ("architectures", "torch_dtype")})
    model = transformers.AutoModelForCausalLM.from_config(config)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.05 * noise)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.copy_(0.05 * torch.randn(config.n_routed_experts, generator=generator))
    model.save_pretrained(tmp_path / "hf")
    report = parity.compare(tmp_path / "hf", "float32", contract="tiny-mla", num_sequences=2, seq_len=20)
    assert report["passed"], report


@pytest.mark.parametrize("change, message", [
    (dict(num_key_value_heads=1), "num_key_value_heads 1 must equal num_attention_heads 3"),
    (dict(n_group=3), "n_group 3 does not divide the 8 routed experts"),
    (dict(topk_method="group_limited_greedy"), "topk_method 'group_limited_greedy'"),
    (dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}), "rope_type"),
    (dict(first_k_dense_replace=7), "first_k_dense_replace must be an int in 0..3"),
    (dict(kv_lora_rank=None), "missing kv_lora_rank"),
    (dict(quantization_config={"quant_method": "fp8", "fmt": "e4m3"}), r"quantization_config \(fp8\) is not supported"),
])
def test_bad_configs_name_the_field(change, message):
    config = {**_config("deepseek-v3, q_lora 24, interleaved rope, 8 experts in 4 groups keep 2, top-3"), **change}
    if change.get("kv_lora_rank", 0) is None:
        config.pop("kv_lora_rank")
    with pytest.raises(SpecError, match=message):
        from_hf_config(config)


def test_bad_mlp_layer_types_and_weights_name_the_field_or_key(tmp_path):
    config = _config("glm-4.7-flash, 5 experts top-2, two shared experts, layers dense/sparse/dense")
    with pytest.raises(SpecError, match="mlp_layer_types must list"):
        from_hf_config({**config, "mlp_layer_types": ["dense", "sparse"]})
    directory = save(init_random(from_hf_config(config), seed=5), tmp_path / "ckpt")
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["model.layers.0.self_attn.kv_b_proj.weight"] = tensors["model.layers.0.self_attn.kv_b_proj.weight"][:-1]
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(SpecError, match=r"model.layers.0.self_attn.kv_b_proj.weight has shape"):
        load(directory)
    del tensors["model.layers.1.mlp.gate.e_score_correction_bias"]
    save_file(tensors, str(directory / "model.safetensors"))
    with pytest.raises(SpecError, match="missing .*e_score_correction_bias"):
        load(directory)


@pytest.fixture(scope="module")
def tiny_mla():
    spec = PRESETS["tiny-mla"].replace(dtype="float32")
    return init_random(spec, seed=0), spec


def _native_mla() -> Contract:
    data = preset_dict("tiny-mla")
    entry = next(e for e in data["composition"] if e["region"] == "mla")
    entry["impl"] = {"id": "mla.native", "version": 1}
    entry["constants"] = {k: entry["constants"][k] for k in ("input_dtype", "output_dtype")}
    data["name"] = "tiny-mla-native-mla"
    return Contract.from_dict(data)


# DeepSeek-V3's group-limited router on fewer requests: the reference router is the slow part on a CPU.
@pytest.mark.parametrize("preset, requests", [("tiny-mla", 8), ("tiny-deepseek-v3", 5)])
def test_audit_is_bitwise_under_tiny_mla_and_native_mla_is_not(preset, requests):
    """Engine prefill chunks and decode steps against both trainer cases, every row bitwise; the same
    audit with `mla.native` (decompressed prefill, absorbed decode) in the contract is not."""
    spec = PRESETS[preset]
    model = init_random(spec, seed=0)
    report = run_audit(model, fit_contract(load_preset("tiny-mla"), spec), requests=requests, max_new_tokens=8, progress=False)
    assert all_equal(report) and report["tokens"] == 8 * requests
    control = run_audit(model, fit_contract(_native_mla(), spec), requests=requests, max_new_tokens=8, progress=False)
    assert not all_equal(control)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
@pytest.mark.parametrize("preset", ["tiny-mla", "tiny-deepseek-v3"])
def test_on_the_gpu_engine_graphs_and_trainer_agree_under_tiny_mla_triton(preset):
    """On a GPU: under tiny-mla-triton (mla.triton and the MoE kernels), engine decode captured as CUDA
    graphs; every sampled token's log-prob and full row equal the trainer's bits; native differs."""
    model = init_random(PRESETS[preset], seed=0).to("cuda")
    contract = fit_contract(load_preset("tiny-mla-triton"), model.spec, device="cuda")
    report = run_audit(model, contract, requests=8, max_new_tokens=8, device="cuda", progress=False)
    assert all_equal(report), report["trainer_score"]
    native = run_audit(model, fit_contract(load_preset("native"), model.spec, device="cuda"), requests=8, max_new_tokens=8,
                       device="cuda", progress=False)
    assert not all_equal(native)
