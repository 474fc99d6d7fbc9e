"""The three identities: stable under reordering, flipped by exactly the changes they are about."""

import copy
import hashlib
import random
import re

import pytest

from conftest import mutated, preset_dict
from isoexec.contract import Contract, canonical_json, identities, load_preset
from isoexec.contract import vocabulary as V

SHA = re.compile(r"^sha256:[0-9a-f]{64}$")


def ids(data: dict) -> dict:
    return identities(Contract.from_dict(data)).to_dict()


def _shuffled(obj, rng: random.Random):
    """Reorder every table's keys, and every list of tables or set-like list."""
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(obj, list):
        items = [_shuffled(v, rng) for v in obj]
        rng.shuffle(items)
        return items
    return obj


def test_identities_have_the_documented_form(dense):
    for value in ids(dense).values():
        assert SHA.match(value)


def test_canonical_json_is_sorted_compact_utf8_and_float_free():
    assert canonical_json({"b": [1, "é"], "a": {"d": True, "c": None}}) == '{"a":{"c":null,"d":true},"b":[1,"é"]}'.encode()
    with pytest.raises(TypeError, match="floats are not allowed"):
        canonical_json({"a": [1.5]})


def test_identity_is_sha256_of_the_canonical_projection():
    # Spelled out by hand: if this changes, every published identity changes.
    contract = load_preset("tiny-dense")
    expected_semantic = (
        '{"cases":{"engine_decode":{"grad":"no_grad","role":"engine"},'
        '"engine_prefill":{"grad":"no_grad","role":"engine"},'
        '"trainer_fwd":{"grad":"autograd","role":"trainer"},'
        '"trainer_score":{"grad":"no_grad","role":"trainer"}},'
        '"model":{"architecture":"Qwen3ForCausalLM","family":"dense","profile":"tiny-dense"},'
        '"ops":{'
    )
    from isoexec.contract.identity import semantic_projection

    text = canonical_json(semantic_projection(contract)).decode()
    assert text.startswith(expected_semantic)
    assert identities(contract).semantic == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("seed", range(8))
def test_stable_under_any_reordering_of_entries_keys_and_lists(dense, seed):
    assert ids(_shuffled(copy.deepcopy(dense), random.Random(seed))) == ids(dense)


def test_stable_when_entries_are_split_per_case(dense):
    split = copy.deepcopy(dense)
    split["composition"] = [
        {**entry, "cases": [case]} for entry in dense["composition"] for case in entry["cases"]
    ]
    assert len(split["composition"]) > len(dense["composition"])
    assert ids(split) == ids(dense)


def test_metadata_changes_no_identity(dense):
    edited = copy.deepcopy(dense)
    edited["name"] = "renamed"
    edited["description"] = "another description"
    assert ids(edited) == ids(dense)


def _other_value(name: str, value):
    if name in V.DTYPE_CONSTANTS:
        return next(d for d in V.DTYPES if d != value)
    if name in V.TREE_CONSTANTS:
        return next(t for t in V.TREE_SHAPES if t != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):  # halving keeps block sizes dividing page and chunk sizes
        return value // 2 if value >= 2 and value % 2 == 0 else value + 1
    if isinstance(value, str):
        return value + "_v2"
    raise AssertionError(f"no mutation for {name}={value!r}")


def _policy_mutations(data: dict):
    """Every single-field edit that must flip numerical_policy: impls, versions, constants, discharge,
    cases, topology and the other claims."""
    for i, entry in enumerate(data["composition"]):
        where = f"composition[{i}]({entry['region']})"
        yield f"{where}.impl.id", lambda d, i=i: d["composition"][i]["impl"].update(id=d["composition"][i]["impl"]["id"] + "_v2")
        yield f"{where}.impl.version", lambda d, i=i: d["composition"][i]["impl"].update(version=d["composition"][i]["impl"]["version"] + 1)
        for name, value in entry["constants"].items():
            new = _other_value(name, value)
            yield f"{where}.constants.{name}", lambda d, i=i, n=name, v=new: d["composition"][i]["constants"].update({n: v})
        yield f"{where}.constants.(added)", lambda d, i=i: d["composition"][i]["constants"].update(extra_switch=True)
        if entry["discharge"]["method"] == "bitwise_equal_to":
            other = next(c for c in entry["cases"] if c != entry["discharge"]["case"])
            yield f"{where}.discharge.case", lambda d, i=i, c=other: d["composition"][i]["discharge"].update(case=c)
    for case in data["cases"]:
        yield f"cases.{case}.shape_domain.max_num_seqs", lambda d, c=case: d["cases"][c]["shape_domain"].update(max_num_seqs=d["cases"][c]["shape_domain"]["max_num_seqs"] + 1)
    yield "claims.topology.tp", lambda d: d["claims"]["topology"].update(tp=[1, 2])
    yield "claims.topology.ep", lambda d: d["claims"]["topology"].update(ep=[1, 4])
    yield "claims.topology.sp", lambda d: d["claims"]["topology"].update(sp=[False])
    yield "claims.state.cuda_graphs", lambda d: d["claims"]["state"].update(cuda_graphs=True)
    yield "claims.tolerances.full_vocab_logprobs", lambda d: d["claims"]["tolerances"].update(full_vocab_logprobs="0.001")
    yield "ops moved between regions", lambda d: (
        d["composition"][_index(d, "linear")]["ops"].remove("lm_head"),
        d["composition"][_index(d, "linear.row_parallel")]["ops"].append("lm_head"),
    )


def _index(data, region):
    return next(i for i, e in enumerate(data["composition"]) if e["region"] == region)


POLICY_MUTATIONS = list(_policy_mutations(preset_dict("tiny-dense")))


@pytest.mark.parametrize("name,edit", POLICY_MUTATIONS, ids=[n for n, _ in POLICY_MUTATIONS])
def test_every_policy_change_flips_numerical_policy(dense, name, edit):
    before = ids(dense)
    after = identities(mutated(dense, edit)).to_dict()
    assert after["numerical_policy"] != before["numerical_policy"], name
    assert after["deployment"] == before["deployment"], name


def test_policy_mutations_cover_every_constant_of_every_entry(dense):
    names = {n for n, _ in POLICY_MUTATIONS}
    total = sum(len(e["constants"]) for e in dense["composition"])
    assert sum(".constants." in n and "(added)" not in n for n in names) == total
    assert sum(n.endswith(".impl.id") for n in names) == len(dense["composition"])
    assert sum(n.endswith(".impl.version") for n in names) == len(dense["composition"])


def test_constant_changes_leave_the_semantic_identity_alone(dense):
    before = ids(dense)["semantic"]
    for name, edit in POLICY_MUTATIONS:
        if ".constants." in name or ".impl." in name:
            assert identities(mutated(dense, edit)).semantic == before, name


def test_semantic_changes_flip_semantic(dense):
    before = ids(dense)
    for edit in (
        lambda d: d["model"].update(architecture="LlamaForCausalLM"),
        lambda d: d["composition"][_index(d, "rms_norm")]["ops"].remove("q_norm"),
    ):
        assert identities(mutated(dense, edit)).semantic != before["semantic"]


DEPLOYMENT_MUTATIONS = [
    ("engine.name", lambda d: d["deployment"]["engine"].update(name="vllm")),
    ("engine.kv_page_size", lambda d: d["deployment"]["engine"].update(kv_page_size=32)),
    ("engine.prefill_chunk_size", lambda d: d["deployment"]["engine"].update(prefill_chunk_size=512)),
    ("engine.max_num_seqs", lambda d: d["deployment"]["engine"].update(max_num_seqs=8)),
    ("engine.max_num_batched_tokens", lambda d: d["deployment"]["engine"].update(max_num_batched_tokens=4096)),
    ("engine.prefix_caching", lambda d: d["deployment"]["engine"].update(prefix_caching=False)),
    ("engine.dp", lambda d: d["deployment"]["engine"].update(dp=4)),
    ("trainer.name", lambda d: d["deployment"]["trainer"].update(name="fsdp")),
    ("trainer.micro_batch_tokens", lambda d: d["deployment"]["trainer"].update(micro_batch_tokens=1024)),
    ("trainer.dp", lambda d: d["deployment"]["trainer"].update(dp=8)),
    ("section removed (defaults)", lambda d: d.pop("deployment")),
]


@pytest.mark.parametrize("name,edit", DEPLOYMENT_MUTATIONS, ids=[n for n, _ in DEPLOYMENT_MUTATIONS])
def test_deployment_only_changes_leave_the_numerical_policy_alone(dense, name, edit):
    before = ids(dense)
    after = identities(mutated(dense, edit)).to_dict()
    assert after["numerical_policy"] == before["numerical_policy"]
    assert after["semantic"] == before["semantic"]
    if name != "section removed (defaults)":  # the preset spells out the defaults
        assert after["deployment"] != before["deployment"]


@pytest.mark.parametrize("field,value", [("tp", 2), ("ep", 2), ("cuda_graphs", True)])
def test_parallel_layout_is_deployment_when_no_bits_are_claimed(native, field, value):
    before = ids(native)
    after = identities(mutated(native, lambda d: d["deployment"]["engine"].update({field: value}))).to_dict()
    assert after["numerical_policy"] == before["numerical_policy"]
    assert after["deployment"] != before["deployment"]


def test_native_and_dense_compute_the_same_function_with_different_bits():
    """Fitted to one model, native and the family's contract name the same function; native's file also
    pins the ops of other families (the MoE layer's), which fitting to a dense model drops."""
    from isoexec.contract import fit_contract
    from isoexec.model import PRESETS

    spec = PRESETS["tiny-dense"]
    dense, native = identities(fit_contract(load_preset("tiny-dense"), spec)), identities(fit_contract(load_preset("native"), spec))
    assert dense.semantic == native.semantic
    assert dense.numerical_policy != native.numerical_policy
    assert identities(load_preset("native")).semantic != identities(load_preset("tiny-dense")).semantic
