"""The unified model on the trainer side: one definition, bitwise equal across packings and cases."""

import dataclasses
import json

import pytest
import torch

from conftest import bitwise_equal
from controls import control_contract
from isoexec.contract import identities, load_preset
from isoexec.model import PRESETS, ModelSpec, SpecError, dense_fields, dense_spec, from_hf_config, init_random, load, load_model, read_config, save
from isoexec.contract import fit_contract
from isoexec.runtime.binding import bind
from isoexec.trainer import sequence_logprobs

TINY = PRESETS["tiny-dense"]


def _spec(**changes) -> ModelSpec:
    return dense_spec(**{**dense_fields(TINY), **changes})


def _sequences(spec, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(spec.vocab_size, (n,), generator=g).tolist() for n in lengths]


# The control pins a split-K linear (`controls.split_k_linear`): the rows of a sequence scored alone or in
# a small micro-batch take another reduction order than in a large one, by construction.
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("preset", ["tiny-dense", "control"])
def test_rows_do_not_depend_on_packing_or_case_under_the_contract(dtype, preset):
    spec = _spec(dtype=dtype)
    model = init_random(spec, seed=1)
    contract = fit_contract(control_contract("linear") if preset == "control" else load_preset(preset), spec)
    seqs = _sequences(spec, [5, 17, 40, 33, 2, 64])
    together = sequence_logprobs(model, contract, seqs, micro_batch_tokens=10_000)
    alone = [sequence_logprobs(model, contract, [s])[0] for s in seqs]
    small = sequence_logprobs(model, contract, seqs, micro_batch_tokens=40)
    fwd = [r.detach() for r in sequence_logprobs(model, contract, seqs, case="trainer_fwd", micro_batch_tokens=70)]
    same = [bitwise_equal(a, b) and bitwise_equal(a, c) and bitwise_equal(a, d) for a, b, c, d in zip(together, alone, small, fwd)]
    if preset == "tiny-dense":
        assert all(same)
    else:
        assert not all(same), "the control was invariant to packing: this check could not fail"


def test_trainer_fwd_carries_gradients_to_the_weights():
    model = init_random(_spec(dtype="float32"), seed=2)
    contract = fit_contract(load_preset("tiny-dense"), model.spec)
    seqs = _sequences(model.spec, [6, 9])
    rows = sequence_logprobs(model, contract, seqs, case="trainer_fwd")
    loss = -sum(r.gather(-1, torch.tensor(s[1:])[:, None]).sum() for r, s in zip(rows, seqs))
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0


def test_logprob_rows_are_normalised_and_close_to_a_float64_forward():
    model = init_random(_spec(dtype="float32"), seed=3)
    contract = fit_contract(load_preset("tiny-dense"), model.spec)
    rows = sequence_logprobs(model, contract, _sequences(model.spec, [12]))[0]
    assert (rows.double().exp().sum(-1) - 1).abs().max() < 1e-5


def test_fit_contract_follows_the_model():
    qwen2 = _spec(architecture="Qwen2ForCausalLM", dtype="float32")
    family = load_preset("tiny-dense")
    fitted = fit_contract(family, qwen2)
    ops = {op for e in fitted.composition for op in e.ops}
    assert "q_norm" not in ops and "k_norm" not in ops
    assert fitted.entry("linear", "trainer_fwd").constants["input_dtype"] == "float32"
    assert fitted.entry("logprobs", "trainer_fwd").constants["output_dtype"] == "float32"
    assert identities(fitted).numerical_policy != identities(family).numerical_policy
    assert identities(fit_contract(family, TINY)).numerical_policy == identities(family).numerical_policy


def test_bind_refuses_a_contract_missing_an_op():
    family = load_preset("tiny-dense")
    entries = [dataclasses.replace(e, ops=[o for o in e.ops if o != "q_norm"]) for e in family.composition]
    with pytest.raises(ValueError, match="does not pin op\\(s\\) q_norm for case engine_decode"):
        bind(dataclasses.replace(family, composition=tuple(entries)), TINY, "engine_decode")


def test_save_and_load_round_trip_bitwise(tmp_path):
    for spec in (TINY, _spec(tie_word_embeddings=False, architecture="Qwen2ForCausalLM")):
        model = init_random(spec, seed=4)
        loaded = load(save(model, tmp_path / spec.architecture))
        assert loaded.spec == spec
        for (name, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(loaded.state_dict().items())):
            assert bitwise_equal(a, b), name


def test_bad_checkpoints_and_configs_are_clear_errors(tmp_path):
    with pytest.raises(SpecError, match="not a model directory"):
        read_config(tmp_path)
    with pytest.raises(SpecError, match="neither a model preset"):
        load_model("tiny-sparse")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="unreadable"):
        read_config(tmp_path)
    config = TINY.to_hf_config()
    with pytest.raises(SpecError, match="'GPT2LMHeadModel' is not supported"):
        from_hf_config({**config, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(SpecError, match="missing vocab_size"):
        from_hf_config({k: v for k, v in config.items() if k != "vocab_size"})
    with pytest.raises(SpecError, match="rope type 'llama3' is not supported"):
        from_hf_config({**config, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(SpecError, match="not a multiple of num_key_value_heads"):
        from_hf_config({**config, "num_key_value_heads": 3})
    save(init_random(TINY), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 96}))
    with pytest.raises(SpecError, match="has shape"):
        load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(SpecError, match="unreadable safetensors"):
        load(tmp_path)


def test_fit_contract_pins_the_gemm_tile_of_the_model_shapes():
    """Fitted to a Qwen3-0.6B-sized model on Hopper, the Triton GEMM entries take the tile the rule gives the
    shapes that do most of the work, and engine_decode an entry of its own with the decode tile; the tiny
    model keeps the preset's tile, and a tile never depends on M."""
    from isoexec.ops.linear.tuning import hopper_decode_tile, hopper_row_parallel_tile, hopper_tile

    family = load_preset("tiny-dense-triton")
    tiny = fit_contract(family, PRESETS["tiny-dense"], arch="sm_90")
    assert tiny.entry("linear", "engine_decode").constants == family.entry("linear", "engine_decode").constants
    big = fit_contract(family, PRESETS["qwen3-0.6b-random"], arch="sm_90")
    # gate/up (3072, 1024) outweigh q, k, v and lm_head in `linear`; down (1024, 3072) outweighs o in `linear.row_parallel`
    for region, rule, (n, k) in (("linear", hopper_tile, (3072, 1024)), ("linear.row_parallel", hopper_row_parallel_tile, (1024, 3072))):
        for case, tile in (("trainer_fwd", rule(n, k)), ("engine_decode", hopper_decode_tile(n, k))):
            constants = big.entry(region, case).constants
            assert {key: constants[key] for key in tile} == tile, (region, case)
        assert big.entry(region, "engine_decode") is not big.entry(region, "trainer_fwd")
    assert identities(big).numerical_policy != identities(tiny).numerical_policy


def test_fit_contract_keeps_the_portable_constants_on_an_arch_without_rules():
    """The Hopper rules apply on Hopper only: on a CPU (or any arch without a rule) the fitted
    contract keeps the family contract's constants, and its description says why."""
    family = load_preset("tiny-dense-triton")
    for arch in ("x86_64", "sm_80"):
        fitted = fit_contract(family, PRESETS["qwen3-0.6b-random"], arch=arch)
        for region in ("linear", "linear.row_parallel", "rms_norm", "logprobs"):
            assert fitted.entry(region, "trainer_fwd").constants == family.entry(region, "trainer_fwd").constants, (arch, region)
        assert len(fitted.composition) == len(family.composition)  # no decode entries of their own
        assert f"no {arch} tuning rules for linear.row_parallel.triton, linear.triton, logprobs.triton" in fitted.description
    assert fit_contract(family, PRESETS["qwen3-0.6b-random"]).description == fit_contract(family, PRESETS["qwen3-0.6b-random"], arch="x86_64").description
    assert "tuning rules" not in fit_contract(load_preset("tiny-dense"), PRESETS["qwen3-0.6b-random"]).description  # nothing to tune
