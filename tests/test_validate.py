"""The admission battery itself: it must reject impls that change their order of operations."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import isoexec_here
from controls import control_contract
from isoexec.cli import main
from isoexec.contract import dump_json, load_preset
from isoexec.ops.linear import probe as linear_probe
from isoexec.ops.linear import reference
from isoexec.runtime import REGISTRY, Impl, Registry, fingerprint, runtime_info
from isoexec.model import PRESETS
from isoexec.validate import geometry_of, records, validate
from isoexec.validate.battery import validate_entry

pytestmark = pytest.mark.fresh_isoexec_home  # about admission records and the battery's first run

CPU = torch.device("cpu")


def _mutant(fn):
    """Register `fn` as linear.reference@1 in a private registry and run the linear probe on it."""
    contract = load_preset("tiny-dense")
    registry = Registry()
    registry.register(Impl(id="linear.reference", version=1, region="linear", cases=frozenset(contract.cases), fn=fn))
    return validate_entry(contract, contract.entry("linear", "trainer_fwd"), linear_probe.probe, registry=registry, device=CPU)


def test_the_reference_linear_is_admitted():
    result = _mutant(reference.linear)
    assert result.status == "admitted" and result.trials > 300 and result.dtypes == ("bfloat16", "float32")


def test_an_impl_whose_order_depends_on_the_batch_size_is_rejected():
    def batch_dependent(x, w, b=None, **constants):
        if x.shape[0] > 4:
            return F.linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)
        return reference.linear(x, w, b, **constants)

    result = _mutant(batch_dependent)
    assert result.status == "rejected"
    assert any("of a batch of" in f for f in result.failures)


def test_an_impl_whose_order_depends_on_the_case_is_rejected():
    def case_dependent(x, w, b=None, **constants):
        tree = "sequential" if torch.is_grad_enabled() else constants["block_tree"]
        return reference.linear(x, w, b, **{**constants, "block_tree": tree})

    result = _mutant(case_dependent)
    assert result.status == "rejected"
    assert {f.split(": ")[1].split(",")[0] for f in result.failures} >= {"engine_decode", "engine_prefill", "trainer_score"}


def test_an_impl_whose_order_depends_on_strides_is_rejected():
    def stride_dependent(x, w, b=None, **constants):
        tree = constants["tree"] if x.is_contiguous() else "balanced_binary"
        return reference.linear(x, w, b, **{**constants, "tree": tree, "block_k": constants["block_k"] if x.is_contiguous() else 8})

    result = _mutant(stride_dependent)
    assert result.status == "rejected" and all("non-contiguous" in f for f in result.failures)


def test_an_impl_that_crashes_on_an_empty_batch_is_rejected():
    def fragile(x, w, b=None, **constants):
        if x.shape[0] == 0:
            raise RuntimeError("no rows")
        return reference.linear(x, w, b, **constants)

    result = _mutant(fragile)
    assert result.status == "rejected" and any("raised RuntimeError: no rows" in f for f in result.failures)


def test_validate_rejects_batch_dependent_linear_and_activation():
    """The controls (`controls.py`) are batch-dependent by construction; the rest of the contract is
    tiny-dense's and is admitted. (Native is no control: which of its kernels this CPU's libraries make
    batch-dependent varies from machine to machine.)"""
    report = validate(control_contract(("linear", "activation")), record=False)
    status = {k["impl"]: k["status"] for k in report["kernels"]}
    assert status["control.split_k_linear@1"] == "rejected"
    assert status["control.vector_tail_silu_mul@1"] == "rejected"
    assert report["rejected"] == 2
    assert set(report["kernels"][0]) >= {"region", "impl", "cases", "status", "failures"}


def test_records_are_written_and_consulted_by_the_fingerprint():
    contract = load_preset("tiny-dense")
    installed = {cell: impl for cell, impl in REGISTRY.resolve(contract, contract.cases_of("trainer")).items() if cell[0] == "linear"}
    assert not any(c["admitted"] for c in fingerprint(contract, installed, role="trainer")["installed"]["linear"].values())
    entry = contract.entry("linear", "trainer_fwd")
    result = validate_entry(contract, entry, linear_probe.probe, registry=REGISTRY, device=CPU)
    impl = REGISTRY.get("linear.reference", 1)
    runtime = runtime_info(CPU)
    records.write(impl, entry.constants, runtime, cases=list(entry.cases), status=result.status, dtypes=list(result.dtypes), trials=result.trials, failures=result.failures)
    cells = fingerprint(contract, installed, role="trainer")["installed"]["linear"]
    assert all(c["admitted"] for c in cells.values())
    assert not records.is_admitted(impl, {**entry.constants, "block_k": 32}, runtime, "trainer_fwd")
    assert not records.is_admitted(impl, entry.constants, {**runtime, "torch": "0.0"}, "trainer_fwd")


def test_fingerprint_looks_records_up_at_the_model_it_names(tmp_path):
    """`validate --model` writes records at that model's geometry, and `fingerprint --model` with the same
    model finds them (that a record counts only at its own geometry is the test below)."""
    env = {**os.environ, "ISOEXEC_HOME": str(tmp_path)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "isoexec", *args], capture_output=True, text=True, timeout=300, env=env)

    assert cli("validate", "--contract", "tiny-dense", "--model", "tiny-dense").returncode == 0
    fitted = json.loads(cli("fingerprint", "--contract", "tiny-dense", "--model", "tiny-dense", "--role", "trainer", "--json").stdout)
    assert all(cell["admitted"] for cells in fitted["installed"].values() for cell in cells.values())


def test_records_count_only_at_the_model_geometry_they_were_proven_at():
    """A record from `validate` without a model (the probes' own small shapes) does not admit an impl for
    a process running a model, nor does one proven at another model's shapes: kernels pick instructions
    and loop shapes by head_dim and K (docs/validate.md)."""
    contract = load_preset("tiny-dense")
    entry = contract.entry("linear", "trainer_fwd")
    impl, runtime = REGISTRY.get("linear.reference", 1), runtime_info(CPU)
    tiny, big = geometry_of(PRESETS["tiny-dense"]), geometry_of(PRESETS["qwen3-0.6b-random"])
    assert tiny != big and tiny["linear_k"] == [64, 128]
    records.write(impl, entry.constants, runtime, geometry=tiny, cases=["trainer_fwd"], status="admitted", dtypes=[], trials=0, failures=[])
    assert records.is_admitted(impl, entry.constants, runtime, "trainer_fwd", tiny)
    assert not records.is_admitted(impl, entry.constants, runtime, "trainer_fwd")  # no model
    assert not records.is_admitted(impl, entry.constants, runtime, "trainer_fwd", big)
    installed = {cell: i for cell, i in REGISTRY.resolve(contract, ["trainer_fwd"]).items() if cell == ("linear", "trainer_fwd")}
    assert fingerprint(contract, installed, role="trainer", geometry=tiny)["installed"]["linear"]["trainer_fwd"]["admitted"]
    assert not fingerprint(contract, installed, role="trainer", geometry=big)["installed"]["linear"]["trainer_fwd"]["admitted"]


def test_validate_command_writes_the_json_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    result = isoexec_here(capsys, "validate", "--contract", "native", "--json", str(out))
    report = json.loads(out.read_text())
    assert result.returncode == (1 if report["rejected"] else 0), result.stderr
    assert report["admitted"] + report["rejected"] == len(report["kernels"]) == result.stdout.count(" trials")
    bad = isoexec_here(capsys, "validate", "--contract", "nope.toml")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such file" in bad.stderr


def test_validate_command_exits_1_on_a_rejection_and_names_it(tmp_path, capsys):
    """In this process, where the control impls are registered."""
    path = tmp_path / "control.json"
    path.write_text(dump_json(control_contract("linear")), "utf-8")
    assert main(["validate", "--contract", str(path), "--no-record"]) == 1
    out = capsys.readouterr().out
    assert "REJECTED  linear" in out and "1 rejected" in out


def test_validate_fits_the_contract_to_a_model_first(tmp_path, capsys):
    """--model validates the contract as that model runs it (here: float32 boundaries; the attention probe
    at its head sizes and the GEMM probes at its projections' K, recorded in the report), and names a
    bad model."""
    out = tmp_path / "report.json"
    result = isoexec_here(capsys, "validate", "--contract", "tiny-dense", "--model", "tiny-dense", "--no-record", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "10 admitted, 0 rejected" in result.stdout
    assert json.loads(out.read_text())["geometry"] == {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "linear_k": [64, 128]}
    bad = isoexec_here(capsys, "validate", "--model", "no-such-model")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no-such-model" in bad.stderr


def test_validate_region_runs_only_the_named_regions_and_names_an_unknown_one(capsys):
    """In this process, where the control impls are registered: the control's rejected linear entry is
    skipped when only another region is asked for."""
    contract = control_contract("linear")
    assert validate(contract, record=False)["rejected"] == 1
    report = validate(contract, record=False, regions={"rms_norm"})
    assert [(k["region"], k["status"]) for k in report["kernels"]] == [("rms_norm", "admitted")] and report["rejected"] == 0
    assert main(["validate", "--region", "rms_norm", "--region", "rope", "--no-record"]) == 0
    out = capsys.readouterr().out
    assert "2 admitted, 0 rejected" in out and "linear" not in out
    assert main(["validate", "--region", "moe.router"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--region moe.router" in err and "rms_norm" in err


def test_validate_refuses_cuda_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    bad = isoexec_here(capsys, "validate", "--device", "cuda")
    assert bad.returncode == 2 and "no CUDA device" in bad.stderr


def test_registry_checks_constants_against_the_impl_signature():
    from conftest import mutated, preset_dict
    from isoexec.runtime import ResolutionError

    data = preset_dict("tiny-dense")
    lin = next(i for i, e in enumerate(data["composition"]) if e["region"] == "linear")
    extra = mutated(data, lambda d: d["composition"][lin]["constants"].update(extra_switch=True))
    with pytest.raises(ResolutionError, match=r'linear/trainer_fwd: impl "linear.reference@1" rejects its constants: unsupported constants extra_switch'):
        REGISTRY.resolve(extra, ["trainer_fwd"])
    missing = mutated(data, lambda d: d["composition"][lin]["constants"].pop("block_k"))
    with pytest.raises(ResolutionError, match="missing constants block_k"):
        REGISTRY.resolve(missing, ["trainer_fwd"])
    att = next(i for i, e in enumerate(data["composition"]) if e["region"] == "attention")
    split = mutated(data, lambda d: d["composition"][att]["constants"].update(split_kv_size=24))
    with pytest.raises(ResolutionError, match="split_kv_size must be 0 or a positive multiple of block_n"):
        REGISTRY.resolve(split, ["engine_decode"])
    assert len(REGISTRY.resolve(load_preset("tiny-dense"))) == 38  # 9 regions x 4 cases + sampling x 2


def test_fingerprint_command_shows_admission_after_validate(tmp_path):
    env_home = {"ISOEXEC_HOME": str(tmp_path)}
    import os

    env = {**os.environ, **env_home}
    before = subprocess.run([sys.executable, "-m", "isoexec", "fingerprint", "--role", "engine", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert before.returncode == 0
    cells = [c for cells in json.loads(before.stdout)["installed"].values() for c in cells.values()]
    assert len(cells) == 20 and not any(c["admitted"] for c in cells)
    assert subprocess.run([sys.executable, "-m", "isoexec", "validate"], capture_output=True, env=env, timeout=300).returncode == 0
    after = subprocess.run([sys.executable, "-m", "isoexec", "fingerprint", "--role", "engine", "--json"], capture_output=True, text=True, env=env, timeout=120)
    cells = [c for cells in json.loads(after.stdout)["installed"].values() for c in cells.values()]
    assert all(c["admitted"] for c in cells)


def test_concurrent_record_writers_merge_their_cases(tmp_path, monkeypatch):
    """A trainer and an engine on one host record the same impl's cases at the same time."""
    import os

    script = (
        "import sys, isoexec.ops\n"
        "from isoexec.contract import load_preset\n"
        "from isoexec.runtime import REGISTRY, runtime_info\n"
        "from isoexec.validate import records\n"
        "entry = load_preset('tiny-dense').entry('linear', 'trainer_fwd')\n"
        "impl = REGISTRY.get('linear.reference', 1)\n"
        "for i in range(40):\n"
        "    records.write(impl, entry.constants, runtime_info('cpu'), cases=[sys.argv[1] + str(i)], status='admitted', dtypes=[], trials=0, failures=[])\n"
    )
    env = {**os.environ, "ISOEXEC_HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, side], env=env) for side in ("trainer", "engine")]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    entry = load_preset("tiny-dense").entry("linear", "trainer_fwd")
    monkeypatch.setenv("ISOEXEC_HOME", str(tmp_path))
    record = records.lookup(REGISTRY.get("linear.reference", 1), entry.constants, runtime_info(CPU))
    assert set(record["cases_proven"]) == {f"{side}{i}" for side in ("trainer", "engine") for i in range(40)}
    assert not list(tmp_path.glob("admissions/*.tmp"))
