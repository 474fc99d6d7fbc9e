"""The handshake between two real processes, and the checks behind it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import entry_index, preset_dict
from isoexec.contract import dump_json, load_preset
from isoexec.contract.schema import Contract
from isoexec.runtime import Impl, Registry, check, fingerprint

pytestmark = pytest.mark.fresh_isoexec_home  # about admission records and the battery's first run

PEER = Path(__file__).with_name("handshake_peer.py")


def _run_pair(tmp_path, trainer_args=(), engine_args=(), trainer_contract="tiny-dense", engine_contract="tiny-dense"):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the peers' store, on a port this process holds
    port = store.port
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PEER.parent), os.environ.get("PYTHONPATH", "")]), "ISOEXEC_HOME": str(tmp_path / "home")}

    def start(role, contract, extra):
        cmd = [sys.executable, str(PEER), "--role", role, "--contract", contract, "--port", str(port), *extra]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    procs = {"trainer": start("trainer", trainer_contract, trainer_args), "engine": start("engine", engine_contract, engine_args)}
    results = {}
    for role, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert out.strip(), f"{role} printed nothing; stderr:\n{err}"
        results[role] = (proc.returncode, json.loads(out.strip().splitlines()[-1]))
    return results


def _write(tmp_path, name, edit) -> str:
    data = preset_dict("tiny-dense")
    edit(data)
    path = tmp_path / f"{name}.json"
    path.write_text(dump_json(Contract.from_dict(data)), "utf-8")
    return str(path)


def test_two_processes_with_the_same_contract_accept(tmp_path):
    results = _run_pair(tmp_path)
    for role, (code, verdict) in results.items():
        assert code == 0 and verdict["ok"], verdict["report"]
        assert verdict["problems"] == []


def test_two_processes_refuse_a_numerical_policy_mismatch(tmp_path):
    att = entry_index(preset_dict("tiny-dense"), "attention")
    other = _write(tmp_path, "block32", lambda d: d["composition"][att]["constants"].update(block_n=8))
    results = _run_pair(tmp_path, engine_contract=other)
    for role, (code, verdict) in results.items():
        assert code == 1 and not verdict["ok"]
        found = {(p["scope"], p["region"], p["case"], p["field"]) for p in verdict["problems"]}
        for case in ("trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"):
            assert ("numerical_policy", "attention", case, "constants.block_n") in found
        text = verdict["report"]
        assert "numerical_policy: attention/{engine_decode,engine_prefill,trainer_fwd,trainer_score} constants.block_n: trainer=16 engine=8" in text
    # Both sides reached the same verdict independently.
    assert results["trainer"][1]["problems"] == results["engine"][1]["problems"]


def test_two_processes_refuse_an_installed_impl_the_contract_does_not_name(tmp_path):
    results = _run_pair(tmp_path, engine_args=["--swap", "attention/engine_decode=attention.native@1"])
    for role, (code, verdict) in results.items():
        assert code == 1 and not verdict["ok"]
        problem = next(p for p in verdict["problems"] if p["scope"] == "installed")
        assert (problem["region"], problem["case"], problem["field"]) == ("attention", "engine_decode", "impl")
        assert problem["values"] == {"contract": "attention.reference@1", "engine": "attention.native@1"}
        assert 'installed: attention/engine_decode impl: contract="attention.reference@1" engine="attention.native@1"' in verdict["report"]


def test_two_processes_refuse_a_semantic_mismatch(tmp_path):
    other = _write(tmp_path, "llama", lambda d: d["model"].update(architecture="LlamaForCausalLM"))
    results = _run_pair(tmp_path, trainer_contract=other)
    for code, verdict in results.values():
        assert code == 1
        assert any(p["scope"] == "semantic" and p["field"] == "model.architecture" for p in verdict["problems"])


def test_deployment_difference_is_a_note_not_a_refusal(tmp_path):
    other = _write(tmp_path, "pages", lambda d: d["deployment"]["engine"].update(kv_page_size=64, max_num_seqs=8))
    results = _run_pair(tmp_path, engine_contract=other)
    for code, verdict in results.values():
        assert code == 0 and verdict["ok"]
        assert [n["scope"] for n in verdict["notes"]] == ["deployment"]


# In-process checks of the rules behind the verdict.


def _stand_in(*tensors, **constants):
    return None


def _installed(contract, role, registry=None):
    registry = registry or Registry()
    for entry in contract.composition:
        if registry.get(entry.impl.id, entry.impl.version) is None:
            registry.register(Impl(id=entry.impl.id, version=entry.impl.version, region=entry.region, cases=frozenset(contract.cases), fn=_stand_in))
    return registry.resolve(contract, contract.cases_of(role))


def _pair(contract=None, engine_contract=None, admitted=True):
    contract = contract or load_preset("tiny-dense")
    engine_contract = engine_contract or contract
    trainer = fingerprint(contract, _installed(contract, "trainer"), role="trainer")
    engine = fingerprint(engine_contract, _installed(engine_contract, "engine"), role="engine")
    for fp in (trainer, engine):  # stand-ins: declare them admitted unless the test is about admission
        for cells in fp["installed"].values():
            for cell in cells.values():
                cell["admitted"] = admitted
    return trainer, engine


def test_check_is_symmetric_and_accepts_a_match():
    trainer, engine = _pair()
    assert check(trainer, engine).ok and check(engine, trainer).ok


def test_native_against_the_contract_is_refused_from_both_orders():
    trainer, engine = _pair(load_preset("tiny-dense"), load_preset("native"))
    one, other = check(trainer, engine), check(engine, trainer)
    assert not one.ok and [p.render() for p in one.problems] == [p.render() for p in other.problems]
    assert any(p.region == "linear" and p.field == "impl" for p in one.problems)


def test_runtime_differences_that_decide_bits_refuse():
    trainer, engine = _pair()
    engine["runtime"]["torch"] = trainer["runtime"]["torch"] + "-other"  # the GPU image runs 2.11.0 itself
    engine["runtime"]["device"]["isa"] = trainer["runtime"]["device"]["isa"] + "-other"  # differs on any host
    engine["runtime"]["device"]["name"] = "another cpu"
    verdict = check(trainer, engine)
    assert {p.field for p in verdict.problems} == {"torch", "device.isa"}
    assert [n.field for n in verdict.notes] == ["device.name"]


def test_same_impl_with_different_source_refuses():
    trainer, engine = _pair()
    engine["installed"]["linear"]["engine_decode"]["source_sha256"] = "sha256:" + "0" * 64
    verdict = check(trainer, engine)
    assert [(p.scope, p.field) for p in verdict.problems] == [("source", "linear.reference@1 source_sha256")]


def test_unreadable_source_and_missing_impls_refuse():
    contract = load_preset("tiny-dense")
    trainer, engine = _pair()
    engine["installed"]["rope"]["engine_decode"]["source_sha256"] = None
    del engine["installed"]["attention"]["engine_prefill"]
    problems = {(p.region, p.case, p.field) for p in check(trainer, engine).problems}
    assert ("rope", "engine_decode", "source_sha256") in problems
    assert ("attention", "engine_prefill", "impl") in problems
    assert contract.claims.is_bitwise


def test_parallel_sizes_outside_the_claims_refuse():
    trainer, engine = _pair()
    trainer["parallel"]["tp"] = 3
    verdict = check(trainer, engine)
    assert [(p.scope, p.field, p.a, p.b) for p in verdict.problems] == [("parallel", "tp", [1, 2, 4, 8], 3)]


def test_impls_without_an_admission_record_refuse_in_a_bitwise_contract():
    trainer, engine = _pair(admitted=False)
    problems = check(trainer, engine).problems
    assert problems and {p.field for p in problems} == {"admitted"}
    pinned = {(r, c) for r, cells in trainer["contract"]["numerical_policy"]["regions"].items() for c, cell in cells.items() if cell["discharge"]["method"] == "bitwise_equal_to"}
    assert {(p.region, p.case) for p in problems} == pinned  # the embedding's proof needs no record
    native_trainer, native_engine = _pair(load_preset("native"), load_preset("native"), admitted=False)
    assert check(native_trainer, native_engine).ok  # no bitwise claim, nothing to admit


def test_two_trainers_refuse():
    trainer, _ = _pair()
    assert not check(trainer, dict(trainer)).ok


def test_fingerprint_records_impl_and_source_per_region_and_case():
    contract = load_preset("tiny-dense")
    fp = fingerprint(contract, _installed(contract, "engine"), role="engine")
    assert fp["cases"] == ["engine_decode", "engine_prefill"]
    cell = fp["installed"]["attention"]["engine_decode"]
    assert cell["impl"] == "attention.reference@1" and cell["source_sha256"].startswith("sha256:")
    assert "trainer_fwd" not in fp["installed"]["attention"]
    assert fp["runtime"]["torch"] and fp["runtime"]["device"]["type"] == "cpu"
    assert fp["guarantees"]["bitwise"] is True
    json.dumps(fp)


@pytest.mark.parametrize("problem", ["unknown", "region", "case", "constants"])
def test_registry_refuses_what_it_cannot_honour(problem):
    from isoexec.runtime import ResolutionError

    contract = load_preset("tiny-dense")
    registry = Registry()

    def reject(constants):
        if constants["block_n"] != 64:
            raise ValueError(f"block_n must be 64, got {constants.get('block_n')}")

    spec = {
        "unknown": dict(id="attention.reference", version=2, region="attention", cases=frozenset(contract.cases)),
        "region": dict(id="attention.reference", version=1, region="linear", cases=frozenset(contract.cases)),
        "case": dict(id="attention.reference", version=1, region="attention", cases=frozenset(["trainer_fwd"])),
        "constants": dict(id="attention.reference", version=1, region="attention", cases=frozenset(contract.cases), check_constants=reject),
    }[problem]
    registry.register(Impl(fn=_stand_in, **spec))
    for entry in contract.composition:
        if entry.region != "attention":
            registry.register(Impl(id=entry.impl.id, version=1, region=entry.region, cases=frozenset(contract.cases), fn=_stand_in))
    with pytest.raises(ResolutionError) as caught:
        registry.resolve(contract, contract.cases_of("engine"))
    message = str(caught.value)
    expected = {
        "unknown": 'attention/engine_decode: impl "attention.reference@1" is not registered (registered for attention: attention.reference@2)',
        "region": 'attention/engine_decode: impl "attention.reference@1" implements region "linear", not "attention"',
        "case": 'attention/engine_decode: impl "attention.reference@1" does not claim case "engine_decode" (claims: trainer_fwd)',
        "constants": 'attention/engine_decode: impl "attention.reference@1" rejects its constants: block_n must be 64, got 16',
    }[problem]
    assert expected in message.splitlines()


def test_source_hash_follows_the_source_file(tmp_path, monkeypatch):
    import importlib

    module = tmp_path / "toy_impl.py"
    module.write_text("def f(x):\n    return x\n", "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("toy_impl")
    first = Impl(id="toy.impl", version=1, region="linear", cases=frozenset(["trainer_fwd"]), fn=toy.f).source_sha256
    module.write_text("def f(x):\n    return x + 0\n", "utf-8")
    second = Impl(id="toy.impl", version=1, region="linear", cases=frozenset(["trainer_fwd"]), fn=toy.f).source_sha256
    assert first != second and first.startswith("sha256:")
    assert Impl(id="b.impl", version=1, region="linear", cases=frozenset(), fn=len).source_sha256 is None
