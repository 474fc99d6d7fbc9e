"""The `isoexec contract` commands as a user runs them: output, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest

from conftest import entry_index, preset_dict
from isoexec.contract import Contract, dump_json, identities, load_preset


def isoexec(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "isoexec", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _write(tmp_path, name, edit=None, text=None):
    path = tmp_path / name
    if text is None:
        data = preset_dict("tiny-dense")
        if edit:
            edit(data)
        text = dump_json(Contract.from_dict(data))
    path.write_text(text, "utf-8")
    return str(path)


def test_show_renders_the_default_preset():
    result = isoexec("contract", "show")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("contract tiny-dense")
    assert identities(load_preset("tiny-dense")).numerical_policy in out
    assert "attention.reference@1" in out and "bitwise_equal_to trainer_fwd" in out


def test_show_json_is_the_canonical_document():
    result = isoexec("contract", "show", "--preset", "native", "--json")
    assert result.returncode == 0
    assert result.stdout.strip() == dump_json(load_preset("native"))


def test_show_reads_a_file(tmp_path):
    path = _write(tmp_path, "mine.json", lambda d: d.update(name="mine"))
    result = isoexec("contract", "show", path)
    assert result.returncode == 0 and result.stdout.startswith("contract mine")


def test_hash_json_has_exactly_the_three_identities(tmp_path):
    path = _write(tmp_path, "c.json")
    result = isoexec("contract", "hash", path, "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout) == identities(load_preset("tiny-dense")).to_dict()
    plain = isoexec("contract", "hash", "native")
    assert plain.returncode == 0 and [line.split()[0] for line in plain.stdout.splitlines()] == ["semantic", "numerical_policy", "deployment"]


def test_diff_exits_zero_when_only_the_deployment_differs(tmp_path):
    other = _write(tmp_path, "pages.json", lambda d: d["deployment"]["engine"].update(kv_page_size=32))
    result = isoexec("contract", "diff", "tiny-dense", other)
    assert result.returncode == 0, result.stdout
    assert "numerical_policy: equal" in result.stdout
    assert "deployment: differs" in result.stdout and "engine.kv_page_size: A=16 B=32" in result.stdout


def test_diff_exits_one_and_names_region_case_and_field(tmp_path):
    lin = entry_index(preset_dict("tiny-dense"), "linear")

    def edit(d):
        d["composition"][lin]["cases"] = ["trainer_fwd", "trainer_score", "engine_prefill"]
        extra = dict(d["composition"][lin], cases=["engine_decode"], constants=dict(d["composition"][lin]["constants"], block_k=32))
        d["composition"].append(extra)

    other = _write(tmp_path, "decode.json", edit)
    result = isoexec("contract", "diff", "tiny-dense", other)
    assert result.returncode == 1
    assert "numerical_policy: differs" in result.stdout
    assert "  linear/engine_decode constants.block_k: A=16 B=32" in result.stdout.splitlines()
    as_json = json.loads(isoexec("contract", "diff", "tiny-dense", other, "--json").stdout)
    assert not as_json["numerical_policy"]["equal"] and as_json["semantic"]["equal"]
    [difference] = as_json["numerical_policy"]["differences"]
    assert (difference["region"], difference["case"], difference["field"]) == ("linear", "engine_decode", "constants.block_k")


def test_diff_of_native_against_the_contract_differs():
    assert isoexec("contract", "diff", "tiny-dense", "native").returncode == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (["contract", "hash", "{dir}/missing.toml"], "no such file"),
        (["contract", "hash", "{dir}/bad.toml"], "invalid TOML"),
        (["contract", "hash", "{dir}/invalid.json"], 'composition[1].constants.block_k: expected a positive int, got "64"'),
        (["contract", "diff", "tiny-dense", "{dir}/bad.toml"], "invalid TOML"),
        (["contract", "show", "--preset", "nope"], 'unknown preset "nope"'),
        (["contract", "hash", "tiny-sparse"], "neither a contract file nor a preset"),
        (["contract", "hash"], "the following arguments are required: FILE"),
        (["contract", "frobnicate"], "invalid choice"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path, args, message):
    _write(tmp_path, "bad.toml", text="name = [")
    invalid = preset_dict("tiny-dense")
    invalid["composition"][entry_index(invalid, "linear")]["constants"]["block_k"] = "64"
    _write(tmp_path, "invalid.json", text=json.dumps(invalid))
    result = isoexec(*[a.format(dir=tmp_path) for a in args])
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [[], ["contract"], ["contract", "show"], ["contract", "hash"], ["contract", "diff"]])
def test_help_explains_each_command(args):
    result = isoexec(*args, "--help")
    assert result.returncode == 0 and result.stdout.startswith("usage: isoexec")


def test_the_worked_example_in_docs_contract_md_holds(tmp_path):
    import re
    from pathlib import Path

    docs = (Path(__file__).parents[1] / "docs" / "contract.md").read_text("utf-8")
    block = re.search(r"## Worked example.*?```toml\n(.*?)```", docs, re.S).group(1)
    preset = Path(__import__("isoexec.contract", fromlist=["x"]).__file__).with_name("presets") / "tiny-dense.toml"
    entries = preset.read_text("utf-8").split("[[composition]]")
    text = "[[composition]]".join(e for e in entries if 'region = "attention"' not in e)
    at = text.index("[claims.topology]")
    path = tmp_path / "this.toml"
    path.write_text(text[:at] + block + "\n" + text[at:], "utf-8")
    result = isoexec("contract", "diff", "tiny-dense", str(path))
    assert result.returncode == 1
    assert 'attention/engine_decode impl: A="attention.reference@1" B="attention.triton_decode@1"' in result.stdout
    assert "semantic: equal" in result.stdout


def test_parity_command_runs_from_the_console_entry(tmp_path):
    pytest.importorskip("transformers")
    from isoexec.model import PRESETS, init_random, save

    save(init_random(PRESETS["tiny-dense"], seed=5), tmp_path / "ckpt")
    result = isoexec("parity", "--model", str(tmp_path / "ckpt"), "--dtype", "float32", "--json", str(tmp_path / "p.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "p.json").read_text())["passed"] is True
    missing = isoexec("parity", "--model", str(tmp_path / "nope"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_building_the_cli_does_not_import_torch():
    """`isoexec contract …` and `--help` answer without loading torch (about 2 s): only the commands that
    run a model import it."""
    script = "import sys\nfrom isoexec.cli import build_parser\nbuild_parser()\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
