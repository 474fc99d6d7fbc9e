"""Every class of malformed field is refused with the path of the field and the problem."""

import copy
import json

import pytest

from conftest import entry_index, mutated, preset_dict
from isoexec.contract import Contract, ContractError, dump_json, load, load_file, load_preset, parse, preset_names


def test_presets_load_and_round_trip_through_canonical_json():
    assert set(preset_names()) >= {"tiny-dense", "native"}
    for name in preset_names():
        contract = load_preset(name)
        assert parse(dump_json(contract), "json") == contract
        assert Contract.from_dict(contract.to_dict()) == contract


def test_tiny_dense_claims_bitwise_and_native_claims_nothing():
    dense, native = load_preset("tiny-dense"), load_preset("native")
    assert dense.claims.is_bitwise and dense.claims.tolerances == {"logprobs": "0", "full_vocab_logprobs": "0"}
    assert not native.claims.is_bitwise
    assert all(entry.discharge.method == "none" for entry in native.composition)
    regions = {e.region for e in dense.composition}
    assert regions >= {"embedding", "linear", "rms_norm", "rope", "attention", "activation", "logprobs", "sampling"}


def test_toml_and_json_files_are_both_accepted(tmp_path):
    contract = load_preset("tiny-dense")
    (tmp_path / "c.json").write_text(dump_json(contract), "utf-8")
    (tmp_path / "c.contract").write_text(dump_json(contract), "utf-8")  # sniffed as JSON
    text = (tmp_path / "c.json").read_text("utf-8")
    assert load_file(tmp_path / "c.json") == contract
    assert load_file(tmp_path / "c.contract") == contract
    assert load(str(tmp_path / "c.json")) == contract
    assert json.loads(text) == contract.to_dict()


def _set(path, value):
    """An edit that sets a nested key; path items are dict keys or list indices."""

    def edit(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _delete(path):
    def edit(data):
        target = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


LIN = entry_index(preset_dict("tiny-dense"), "linear")
ATT = entry_index(preset_dict("tiny-dense"), "attention")
ROW = entry_index(preset_dict("tiny-dense"), "linear.row_parallel")
SMP = entry_index(preset_dict("tiny-dense"), "sampling")

CASES = [
    # (edit, exact message or the start of it)
    (_set(["composition", LIN, "constants", "block_k"], "64"), f'composition[{LIN}].constants.block_k: expected a positive int, got "64"'),
    (_set(["composition", LIN, "constants", "block_k"], 0), f"composition[{LIN}].constants.block_k: expected a positive int, got 0"),
    (_set(["composition", LIN, "constants", "block_k"], True), f"composition[{LIN}].constants.block_k: expected a positive int, got true"),
    (_set(["composition", ROW, "constants", "num_leaves"], 6), f"composition[{ROW}].constants.num_leaves: expected a power of two, got 6"),
    (_set(["composition", LIN, "constants", "accum_dtype"], "fp32"), f'composition[{LIN}].constants.accum_dtype: expected one of "float64"'),
    (_set(["composition", LIN, "constants", "tree"], "random"), f'composition[{LIN}].constants.tree: expected one of "balanced_binary"'),
    (_set(["composition", ATT, "constants", "split_kv_size"], -1), f"composition[{ATT}].constants.split_kv_size: expected an int ≥ 0, got -1"),
    (_set(["composition", LIN, "constants", "scale"], 0.5), f"composition[{LIN}].constants.scale: expected an int, bool or string, got 0.5 (a raw float); floats are never stored raw"),
    (_set(["composition", LIN, "constants", "eps"], 1e-6), f"composition[{LIN}].constants.eps: expected a decimal string"),
    (_set(["composition", LIN, "constants", "eps"], "f32:0x3f80"), f"composition[{LIN}].constants.eps: expected a decimal string"),
    (_set(["composition", LIN, "constants", "nested"], {"a": 1}), f"composition[{LIN}].constants.nested: expected an int, bool or string, got a table"),
    (_set(["composition", LIN, "constants", "BlockK"], 1), f'composition[{LIN}].constants.BlockK: expected a lower-case identifier as a key, got "BlockK"'),
    (_set(["claims", "tolerances", "logprobs"], 0.0), "claims.tolerances.logprobs: expected a non-negative decimal string"),
    (_set(["claims", "tolerances", "logprobs"], "-1e-3"), 'claims.tolerances.logprobs: expected a non-negative decimal string ("0" = bitwise), got "-1e-3"'),
    (_set(["claims", "tolerances", "kl"], "0"), 'claims.tolerances.kl: expected one of "logprobs", "full_vocab_logprobs", got "kl"'),
    (_set(["claims", "topology", "tp"], []), "claims.topology.tp: expected a non-empty list, got []"),
    (_set(["claims", "topology", "tp"], [1, 1]), 'claims.topology.tp[1]: duplicate entry 1'),
    (_set(["claims", "state", "cuda_graphs"], "yes"), 'claims.state.cuda_graphs: expected true or false, got "yes"'),
    (_set(["foo"], 1), "foo: unknown key (expected one of: "),
    (_set(["composition", 0, "extra"], 1), "composition[0].extra: unknown key"),
    (_delete(["composition", 0, "impl"]), "composition[0].impl: missing required key"),
    (_delete(["claims"]), "claims: missing required key"),
    (_set(["model"], "qwen3"), 'model: expected a table, got "qwen3"'),
    (_set(["model", "family"], ""), 'model.family: expected a non-empty string, got ""'),
    (_set(["schema_version"], 2), "schema_version: unsupported version 2 (this isoexec reads 1)"),
    (_delete(["cases", "engine_decode"]), 'cases: missing required case "engine_decode"'),
    (_set(["cases", "engine_decode", "grad"], "autograd"), 'cases.engine_decode.grad: an engine case runs without autograd: expected "no_grad"'),
    (_set(["cases", "engine_decode", "role"], "server"), 'cases.engine_decode.role: expected one of "trainer", "engine", got "server"'),
    (_set(["cases", "engine_decode", "state"], ["paged"]), 'cases.engine_decode.state[0]: expected one of "kv_cache", "recurrent_state", got "paged"'),
    (_set(["cases", "engine_decode", "shape_domain", "max_query_len"], 4096), "cases.engine_decode.shape_domain.max_query_len: 4096 exceeds max_seq_len 2048"),
    (_delete(["cases", "engine_decode", "shape_domain", "max_seq_len"]), "cases.engine_decode.shape_domain.max_seq_len: missing required key"),
    (_set(["composition", 0, "region"], "conv"), 'composition[0].region: expected one of "embedding"'),
    (_set(["composition", 0, "impl", "version"], "1"), 'composition[0].impl.version: expected a positive int, got "1"'),
    (_set(["composition", 0, "impl", "id"], "Embedding Ref"), 'composition[0].impl.id: expected a dotted lower-case name ("linear.reference"), got "Embedding Ref"'),
    (_set(["composition", 0, "ops"], []), "composition[0].ops: expected a non-empty list, got []"),
    (_set(["composition", 0, "cases"], ["trainer_fwd", "trainer_step"]), 'composition[0].cases: unknown case "trainer_step"'),
    (_set(["composition", SMP, "cases"], ["engine_prefill", "engine_decode", "trainer_fwd"]), f'composition[{SMP}].cases: region "sampling" does not run in trainer case "trainer_fwd"'),
    (_set(["composition", ATT, "cases"], ["trainer_fwd", "trainer_score", "engine_prefill"]), 'composition: region "attention" is not pinned for case "engine_decode"'),
    (_set(["composition", ATT, "ops"], ["self_attn", "q_proj"]), f'composition[{max(ATT, LIN)}].ops: op "q_proj" in case'),
    (_set(["composition", ATT, "discharge"], {"method": "bitwise_equal_to"}), f'composition[{ATT}].discharge.case: required when method is "bitwise_equal_to"'),
    (_set(["composition", ATT, "discharge"], {"method": "proof", "proof": "it_is_fine"}), f'composition[{ATT}].discharge.proof: expected one of "exact_gather"'),
    (_set(["composition", ATT, "discharge"], {"method": "none", "case": "trainer_fwd"}), f'composition[{ATT}].discharge.case: not allowed when method is "none"'),
    (_set(["composition", ATT, "discharge"], {"method": "none"}), f'composition[{ATT}].discharge.method: "none" is not allowed in a contract that claims a tolerance of "0"'),
    (_set(["composition", SMP, "discharge", "case"], "trainer_fwd"), f'composition[{SMP}].discharge.case: region "sampling" is not pinned for case "trainer_fwd"'),
    (_set(["deployment", "engine", "kv_page_size"], 0), "deployment.engine.kv_page_size: expected a positive int, got 0"),
    (_set(["deployment", "engine", "tp"], 3), "deployment.engine.tp: 3 is outside claims.topology.tp [1, 2, 4, 8]"),
    (_set(["deployment", "trainer", "ep"], 2), "deployment.trainer.ep: 2 is outside claims.topology.ep [1]"),
    (_set(["claims", "state", "prefix_caching"], False), "deployment.engine.prefix_caching: enabled, but claims.state.prefix_caching is false"),
    (_set(["claims", "state", "chunked_prefill"], False), "deployment.engine.prefill_chunk_size: 256 splits prompts of up to 2048 tokens, but claims.state.chunked_prefill is false"),
]


@pytest.mark.parametrize("edit,message", CASES, ids=[m.split(":")[0] + f"#{i}" for i, (_, m) in enumerate(CASES)])
def test_invalid_field_is_named_by_path(dense, edit, message):
    with pytest.raises(ContractError) as caught:
        mutated(dense, edit)
    assert str(caught.value).startswith(message), str(caught.value)


def test_pages_and_chunks_need_not_align_to_the_key_block(dense):
    """A row's bits do not depend on where its chunk starts or how its keys are paged, so the contract
    leaves both sizes free (the attention probe runs chunks of 5 and 7 and pages smaller than a block)."""
    def edit(data):
        _set(["deployment", "engine", "kv_page_size"], 24)(data)
        _set(["deployment", "engine", "prefill_chunk_size"], 100)(data)

    contract = mutated(dense, edit)
    assert (contract.deployment.engine.kv_page_size, contract.deployment.engine.prefill_chunk_size) == (24, 100)


def test_ops_conflict_names_both_entries(dense):
    with pytest.raises(ContractError, match=r'op "q_proj" in case "[a-z_]+" is already assigned by composition\[\d\]'):
        mutated(dense, _set(["composition", ATT, "ops"], ["self_attn", "q_proj"]))


def test_region_pinned_twice_for_a_case_is_refused(dense):
    def edit(data):
        extra = copy.deepcopy(data["composition"][LIN])
        extra["cases"] = ["engine_decode"]
        extra["ops"] = ["extra_proj"]
        data["composition"].append(extra)

    with pytest.raises(ContractError, match=rf'composition\[\d+\]\.cases: region "linear" in case "engine_decode" is already pinned by composition\[{LIN}\]'):
        mutated(dense, edit)


def test_reals_are_canonicalised(dense):
    a = mutated(dense, _set(["composition", LIN, "constants", "eps"], "1e-6"))
    b = mutated(dense, _set(["composition", LIN, "constants", "eps"], "0.0000010"))
    assert a.entry("linear", "trainer_fwd").constants["eps"] == "0.000001"
    assert a == b
    c = mutated(dense, _set(["composition", LIN, "constants", "eps"], "f32:0x358637BD"))
    assert c.entry("linear", "trainer_fwd").constants["eps"] == "f32:0x358637bd"
    zero = mutated(dense, _set(["claims", "tolerances", "logprobs"], "-0.0"))
    assert zero.claims.tolerances["logprobs"] == "0"


def test_direct_construction_validates_too():
    from isoexec.contract import Entry

    with pytest.raises(ContractError, match=r'^constants.block_k: expected a positive int, got "64"$'):
        Entry(
            region="linear",
            ops=["q_proj"],
            cases=["trainer_fwd"],
            impl={"id": "x", "version": 1},
            constants={"block_k": "64"},
            discharge={"method": "none"},
        )


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("bad.toml", "schema_version = 1\nname = [", "invalid TOML: "),
        ("bad.json", '{"schema_version": 1,', "invalid JSON: "),
        ("dup.json", '{"name": "a", "name": "b"}', "name: duplicate key"),
        ("nan.json", '{"schema_version": NaN}', "NaN is not allowed: floats are never stored raw"),
        ("float.json", '{"schema_version": 1.0}', "schema_version: unsupported version 1.0 (a raw float)"),
        ("list.json", "[1, 2]", "expected a table, got [1, 2]"),
        ("empty.toml", "", "schema_version: missing required key"),
    ],
)
def test_malformed_files_are_refused(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, "utf-8")
    with pytest.raises(ContractError) as caught:
        load_file(path)
    assert str(caught.value).startswith(f"{path}: {message}"), str(caught.value)


def test_unreadable_inputs_are_refused(tmp_path):
    (tmp_path / "latin1.toml").write_bytes(b'name = "caf\xe9"')
    with pytest.raises(ContractError, match="not UTF-8 text"):
        load_file(tmp_path / "latin1.toml")
    with pytest.raises(ContractError, match="no such file"):
        load(str(tmp_path / "missing.toml"))
    with pytest.raises(ContractError, match="is a directory"):
        load_file(tmp_path)
    with pytest.raises(ContractError, match=r'"tiny-sparse" is neither a contract file nor a preset \(presets: '):
        load("tiny-sparse")
    with pytest.raises(ContractError, match='unknown preset "nope"'):
        load_preset("nope")
