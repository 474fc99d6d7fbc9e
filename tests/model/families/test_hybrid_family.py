"""The hybrid families (Qwen3.5, Qwen3.5-MoE, Qwen3-Next: Gated DeltaNet + gated full attention): parity with transformers' own torch
path on tiny configs (value heads > key heads, sequences over several 64-token chunks), the config read
back from what it writes, a multimodal checkpoint read for its language model, bad configs refused in one
line, and the engine (prefill chunks cut anywhere, decode from every offset of a chunk, preemption, the
per-sequence state in its slots) bitwise the trainer's under tiny-hybrid, with native's two forms visibly not."""

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import bitwise_equal, preset_dict
from isoexec.audit import all_equal, run_audit
from isoexec.contract import Contract, fit_contract, load_preset
from isoexec.model import PRESETS, SpecError, from_hf_config, init_random, load, save

transformers = pytest.importorskip("transformers")


def _spec(dtype="float32", preset="tiny-hybrid", **config_changes):
    config = {**PRESETS[preset].to_hf_config(), "torch_dtype": dtype, **config_changes}
    return from_hf_config(config)


@pytest.mark.parametrize("preset, dtype, changes", [
    ("tiny-hybrid", "float32", {}),
    ("tiny-hybrid", "bfloat16", {}),
    # two full-attention layers, 8 value heads on 2 key heads, full rotary, a conv of 3
    ("tiny-hybrid", "float32", dict(layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
                                    linear_num_value_heads=8, linear_conv_kernel_dim=3,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0})),
    ("tiny-hybrid-moe", "float32", {}),
    ("tiny-hybrid-moe", "float32", dict(num_experts=5, num_experts_per_tok=3, linear_num_value_heads=6, linear_num_key_heads=3)),
    # Qwen3-Next: in_proj_qkvz / in_proj_ba fused per key head (3 value heads each), dense layers 0 and 2
    ("tiny-qwen3-next", "float32", dict(linear_num_value_heads=6, linear_num_key_heads=2, mlp_only_layers=[0], decoder_sparse_step=2)),
    ("tiny-qwen3-next", "bfloat16", {}),
])
def test_parity_with_transformers(tmp_path, preset, dtype, changes):
    """transformers' Gated DeltaNet runs its own torch functions (the report says which were pinned), and
    its float64 reference run keeps float64 where the modeling code casts to float32 by name."""
    from isoexec import parity

    spec = _spec(dtype, preset, **changes)
    directory = save(init_random(spec, seed=0), tmp_path / "ckpt")
    report = parity.compare(directory, dtype, num_sequences=3, seq_len=150)
    assert report["architecture"] == spec.architecture and report["contract"] == "tiny-hybrid"
    assert "torch_chunk_gated_delta_rule" in report["transformers_path"]
    assert report["passed"], report


@pytest.mark.parametrize("preset", ["tiny-hybrid", "tiny-hybrid-moe", "tiny-qwen3-next"])
def test_the_config_reads_back_as_the_same_spec(preset):
    spec = PRESETS[preset]
    assert from_hf_config(json.loads(json.dumps(spec.to_hf_config()))) == spec
    kinds = [layer.mixer.kind for layer in spec.layers]
    assert kinds == ["gdn", "gdn", "gdn", "gqa"] and spec.zero_centered_norms


def test_a_multimodal_checkpoint_is_read_for_its_language_model(tmp_path, caplog):
    spec = _spec()
    model = init_random(spec, seed=2)
    text = save(model, tmp_path / "text")
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v for k, v in load_file(text / "model.safetensors").items()}
    tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    tensors["mtp.fc.weight"] = torch.zeros(2, 2)
    multimodal = tmp_path / "multimodal"
    multimodal.mkdir()
    save_file(tensors, str(multimodal / "model.safetensors"))
    text_config = json.loads((text / "config.json").read_text())
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text_config,
              "vision_config": {"depth": 1}, "tie_word_embeddings": spec.tie_word_embeddings}
    (multimodal / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        loaded = load(multimodal)
    assert "ignored 2 checkpoint tensors" in caplog.text
    for (name, ours), (_, theirs) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert bitwise_equal(ours, theirs), name


@pytest.mark.parametrize("changes, message", [
    (dict(layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention"]), "layer_types must list 4 of"),
    (dict(linear_num_value_heads=3), "not a multiple of linear_num_key_heads"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}), "rope type 'yarn' is not supported"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
])
def test_bad_configs_are_refused_in_one_line(changes, message):
    with pytest.raises(SpecError, match=message):
        _spec(**changes)


def _contract(name: str, chunk_size: int, claim_graphs: bool = False) -> Contract:
    """`name` (tiny-hybrid or native) with gdn.core's chunks of `chunk_size`: short generations then cross
    several chunk boundaries and decode from every offset of a chunk. `claim_graphs`: it claims its bits
    under padded (CUDA-graph) decode too, which the test then checks."""
    data = preset_dict(name)
    if claim_graphs:
        data["claims"]["state"]["cuda_graphs"] = True
    entry = next(e for e in data["composition"] if e["region"] == "gdn.core")
    entry["constants"]["chunk_size"] = chunk_size
    data["name"] = f"{name}-chunks-of-{chunk_size}"
    return Contract.from_dict(data)


@pytest.mark.parametrize("preset", ["tiny-hybrid", "tiny-hybrid-moe", "tiny-qwen3-next"])
def test_audit_is_bitwise_under_tiny_hybrid_and_native_gdn_is_not(caplog, preset):
    """8 requests of 8 new tokens over prompts of up to ~37 tokens, in chunks of 8: every sampled token's
    row, in prefill chunks that end mid-chunk and decode steps at every offset, is the trainer's bits."""
    spec = PRESETS[preset]
    model = init_random(spec, seed=0)
    report = run_audit(model, fit_contract(_contract("tiny-hybrid", 8), spec), requests=8, max_new_tokens=8, progress=False)
    assert all_equal(report) and report["tokens"] == 64
    control = run_audit(model, fit_contract(_contract("native", 8), spec), requests=8, max_new_tokens=8, progress=False)
    assert not all_equal(control)
    assert f"prefix caching is off for {spec.architecture}" in caplog.text  # native's deployment asks for it


def _rows_inverse(name: str = "tiny-hybrid-triton") -> Contract:
    """`name` with gdn.core.triton's inverse by rows (its slot rows then keep T's rows too)."""
    data = preset_dict(name)
    next(e for e in data["composition"] if e["region"] == "gdn.core")["constants"]["inverse"] = "rows"
    data["name"] = f"{name}-rows"
    return Contract.from_dict(data)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's run; on a GPU the audit test below takes both inverses")
def test_audit_is_bitwise_under_the_triton_contract_with_the_inverse_by_rows():
    """tiny-hybrid-triton (chunks of 16) with `inverse = "rows"`, in Triton's interpreter: 3 requests of 20 new tokens
    (generations that cross a chunk boundary, decode steps that solve T's row from the slot's earlier rows, prefill
    chunks that end mid-chunk) give every token's row the trainer's bits; native's recurrent decode does not."""
    spec = PRESETS["tiny-hybrid"]
    model = init_random(spec, seed=0)
    report = run_audit(model, fit_contract(_rows_inverse(), spec), requests=3, max_new_tokens=20, progress=False)
    assert all_equal(report) and report["tokens"] == 60
    assert not all_equal(run_audit(model, fit_contract(load_preset("native"), spec), requests=3, max_new_tokens=20, progress=False))


def test_a_sequence_slot_is_reused_without_clearing():
    """Two generate calls through one engine: the second's sequences land in slots the first left
    holding state, and their rows are still the trainer's (a sequence at position 0 starts from zeros)."""
    from isoexec.engine import EngineConfig, LLMEngine, SamplingParams

    spec = PRESETS["tiny-hybrid"]
    model = init_random(spec, seed=1)
    contract = fit_contract(_contract("tiny-hybrid", 8), spec)
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, num_pages=32, max_num_seqs=2))
    prompts = [[5, 6, 7] * 4, [9] * 11, [3, 1] * 5]
    first = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=1.0), progress=False)
    engine.runner.reset = lambda: None  # keep the slots' state across calls: the second call must not need it cleared
    second = engine.generate(prompts, SamplingParams(max_tokens=6, temperature=1.0), progress=False)
    for a, b in zip(first, second):
        assert a.token_ids == b.token_ids and bitwise_equal(a.logprobs, b.logprobs)


@pytest.mark.parametrize("contract_name", ["tiny-hybrid", "control"])
def test_async_scheduling_leaves_the_rows_of_recurrent_layers_unchanged(contract_name):
    """With async scheduling a request that draws a stop token runs one decode step more, which moves its
    sequence slot's state past its end; the next generate's requests land in those slots without clearing
    them. Their rows, and the stopped requests', are those of steps run one at a time, bit for bit. The
    control's linear takes another order for calls of at most 2 rows (small_rows = 2): the decode step after
    the first stop has 2 rows one at a time and 3 with the stopped request's extra row, so its rows differ."""
    from controls import control_dict
    from isoexec.engine import EngineConfig, LLMEngine, SamplingParams

    spec = PRESETS["tiny-hybrid"]
    model = init_random(spec, seed=1)
    if contract_name == "control":
        data = control_dict("linear", "tiny-hybrid", small_rows=2)
        next(e for e in data["composition"] if e["region"] == "gdn.core")["constants"]["chunk_size"] = 8
        contract = fit_contract(Contract.from_dict(data), spec)
    else:
        contract = fit_contract(_contract("tiny-hybrid", 8), spec)
    prompts = [[5, 6, 7] * 4, [9] * 11, [3, 1] * 5]
    free = LLMEngine(model, contract, EngineConfig.from_contract(contract, num_pages=32, max_num_seqs=4)).generate(
        prompts, SamplingParams(max_tokens=12, temperature=1.0), progress=False)
    params = [SamplingParams(max_tokens=12, temperature=1.0, stop_token_ids=(c.token_ids[i],)) for c, i in zip(free, (2, 5, 11))]
    runs = []
    for overlap in (False, True):
        engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, num_pages=32, max_num_seqs=4, async_scheduling=overlap))
        first = engine.generate(prompts, params, progress=False)
        engine.runner.reset = lambda: None  # the second call's requests start in slots holding the first's state
        runs.append((first + engine.generate(prompts[::-1], params[::-1], progress=False), dict(engine.stats)))
    (one_at_a_time, sync_stats), (overlapped, async_stats) = runs
    assert async_stats["decode_tokens"] > sync_stats["decode_tokens"] and async_stats["overlapped_steps"] > 0
    assert any(c.finish_reason == "stop" and len(c.token_ids) < 12 for c in overlapped)
    same = [a.token_ids == b.token_ids and a.finish_reason == b.finish_reason and bitwise_equal(a.logprobs, b.logprobs)
            for a, b in zip(one_at_a_time, overlapped)]
    assert all(same) == (contract_name != "control")


def test_padded_decode_steps_leave_the_rows_unchanged():
    """Decode padded to its bucket (graphs.py's forward, eager on a CPU): the padded rows run in sequence
    slots of their own, so the real rows and tokens are those of unpadded decode, bit for bit."""
    from isoexec.engine import EngineConfig, LLMEngine, SamplingParams

    spec = PRESETS["tiny-hybrid"]
    model = init_random(spec, seed=2)
    contract = fit_contract(_contract("tiny-hybrid", 8, claim_graphs=True), spec)
    prompts = [[5, 6, 7] * 4, [9] * 11, [3, 1] * 5]
    outs = []
    for graphs in (False, True):
        config = EngineConfig.from_contract(contract, num_pages=32, max_num_seqs=4, cuda_graphs=graphs)
        outs.append(LLMEngine(model, contract, config).generate(prompts, SamplingParams(max_tokens=10, temperature=1.0), progress=False))
    for eager, padded in zip(*outs):
        assert eager.token_ids == padded.token_ids and bitwise_equal(eager.logprobs, padded.logprobs)


def test_qwen3_next_projections_split_and_fuse_back_exactly():
    """The fused per-key-head layout -> the layer's four projections -> fused again: the same bits."""
    from isoexec.model.families import qwen3_next

    spec = PRESETS["tiny-qwen3-next"]
    ours = {k: v for k, v in init_random(spec, seed=4).state_dict().items() if "linear_attn.in_proj" in k}
    fused = qwen3_next.fuse_projections(ours, spec)
    assert not any("in_proj_qkv." in k for k in fused) and any("in_proj_qkvz" in k for k in fused)
    back = qwen3_next.split_projections(fused, spec)
    assert back.keys() == ours.keys() and all(bitwise_equal(back[k], ours[k]) for k in ours)


@pytest.mark.parametrize("preset", ["tiny-hybrid", "tiny-hybrid-moe", "tiny-qwen3-next", "qwen3.5-9b-4l-random", "qwen3.5-35b-a3b-4l-random",
                                    "qwen3.5-35b-a3b-random"])
def test_the_gpu_contract_fits_and_binds_every_op_of_the_hybrid_families(preset):
    """tiny-hybrid-triton fitted for an H200 (sm_90) names an impl for every op each hybrid layer calls, in
    every case; its gdn.core and gdn.conv entries are Triton kernels, the core in chunks of 16."""
    from isoexec.runtime.binding import bind

    contract = fit_contract(load_preset("tiny-hybrid-triton"), PRESETS[preset], arch="sm_90")
    binding = bind(contract, PRESETS[preset], contract.cases)
    assert all("gdn_core" in ops and "conv1d" in ops and "self_attn" in ops for ops in binding.ops.values())
    assert contract.entry("gdn.core", "engine_decode").impl.id == "gdn.core.triton"
    assert contract.entry("gdn.core", "engine_decode").constants["chunk_size"] == 16
    assert contract.entry("gdn.conv", "engine_decode").impl.id == "gdn.conv.triton"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="runs the Triton kernels compiled for a GPU")
@pytest.mark.parametrize("preset", ["tiny-hybrid", "tiny-hybrid-moe"])
@pytest.mark.parametrize("inverse", ["products", "rows"])
def test_on_the_gpu_the_audit_is_bitwise_under_tiny_hybrid_triton(preset, inverse):
    """On a GPU: under tiny-hybrid-triton (decode steps as CUDA graphs; gdn.core's inverse by products, the preset's,
    or by rows) every sampled token's log-prob and full row equal the trainer's bits over generations that cross
    several chunks; native differs."""
    model = init_random(PRESETS[preset], seed=0).to("cuda")
    contract = load_preset("tiny-hybrid-triton") if inverse == "products" else _rows_inverse()
    report = run_audit(model, fit_contract(contract, model.spec, device="cuda"), requests=4, max_new_tokens=70, device="cuda",
                       progress=False)
    assert all_equal(report), report["trainer_score"]
    native = run_audit(model, fit_contract(load_preset("native"), model.spec, device="cuda"), requests=4, max_new_tokens=70, device="cuda",
                       progress=False)
    assert not all_equal(native)


@pytest.mark.parametrize("preset", ["tiny-hybrid-moe", "qwen3.5-9b-4l-random", "qwen3.5-35b-a3b-random"])
def test_the_fast_baseline_binds_every_op_of_the_hybrid_families(preset):
    """benchmarks/contracts/fast-baseline.toml, which bench.py's rl section and issue 21's step compare the
    contract with, names an impl for every op of the hybrid layers (its GDN entries are the contract's kernels)."""
    from pathlib import Path

    from isoexec.contract import load
    from isoexec.runtime.binding import bind

    baseline = load(str(Path(__file__).resolve().parents[3] / "benchmarks" / "contracts" / "fast-baseline.toml"))
    contract = fit_contract(baseline, PRESETS[preset], arch="sm_90")
    binding = bind(contract, PRESETS[preset], contract.cases)
    assert all("gdn_core" in ops and "experts" in ops or "moe" not in preset for ops in binding.ops.values())
    assert contract.entry("gdn.core", "trainer_fwd").impl.id == "gdn.core.triton" and not contract.claims.is_bitwise
