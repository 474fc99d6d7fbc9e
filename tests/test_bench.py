"""benchmarks/bench.py end to end at --small sizes on the CPU: every section writes positive figures."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ("tiny-dense", "native")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _positive(row: dict, *keys: str) -> None:
    for key in keys:
        assert isinstance(row.get(key), float) and row[key] > 0, (key, row)


def test_small_cpu_run_writes_every_section(tmp_path):
    sections = ["attention", "engine", "trainer", "roofline", "rl", *(["hf"] if HAS_TRANSFORMERS else [])]
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "ISOEXEC_COMMIT": "abc1234"}
    command = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--small", "--device", "cpu", *sections, "--json", str(out)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())

    assert results["commit"] == "abc1234" and results["device"].startswith("cpu") and results["torch"]
    assert results["command"][1:] == command[2:] and results["contracts"] == list(CONTRACTS)
    assert set(results["section_seconds"]) == set(sections) and "gemm" not in results
    assert "attention.triton: skipped" in done.stdout

    forms = [(row["form"], row["batch"], row["keys"]) for row in results["attention"]]
    assert forms == [("prefill", 1, 32), ("prefill", 1, 64), ("decode", 1, 32), ("decode", 1, 64), ("decode", 4, 32), ("decode", 4, 64)]
    for row in results["attention"]:
        unit = "tflops" if row["form"] == "prefill" else "tbps"
        for impl in ("sdpa", "native", "reference"):
            _positive(row, f"{impl}_ms", f"{impl}_{unit}")
        _positive(row, "native_vs_sdpa", "reference_vs_sdpa")
        assert row["native_max_abs_diff"] < 0.05 and row["reference_max_abs_diff"] < 0.05, row

    # The model sections' results are keyed by model, and the rl section's by its own models.
    assert all(set(results[section]) == {"tiny-dense"} for section in sections if section != "attention")
    rl = results["rl"]["tiny-dense"]
    for c in CONTRACTS:
        _positive(rl, *(f"{c}_{phase}_s" for phase in ("step", "generate", "train", "sync")))
        assert rl[f"{c}_tokens"][0] > 0
    assert rl["tiny-dense_bitwise_equal_fraction"] == [1.0]
    _positive(rl, "tiny-dense_time_over_native_step")
    assert [row["batch"] for row in results["engine"]["tiny-dense"]] == [1, 4]
    for row in results["engine"]["tiny-dense"]:
        _positive(row, *(f"{c}_tokens_per_s" for c in CONTRACTS), *(f"{c}_decode_step_ms" for c in CONTRACTS), "tiny-dense_vs_native")

    roofline = results["roofline"]["tiny-dense"]
    _positive(roofline, "copy_bandwidth_gbps")
    assert roofline["weight_bytes"] > 0 and roofline["kv_bytes_per_key"] == 2 * 2 * 2 * 16 * 2  # layers, K and V, Hkv, D, bf16
    assert [(row["contract"], row["batch"]) for row in roofline["rows"]] == [(c, b) for c in CONTRACTS for b in (1, 4)]
    for row in roofline["rows"]:
        _positive(row, "decode_step_ms", "roofline_ms", "fraction_of_roofline")
        assert row["mean_context"] == 16 + 8 / 2  # prompt + half the new tokens, on average over the decode steps
        assert row["fraction_of_roofline"] < 1

    trainer, = results["trainer"]["tiny-dense"]
    _positive(trainer, "tiny-dense_ms", "native_ms", "tiny-dense_vs_native")

    if HAS_TRANSFORMERS:
        for row in results["hf"]["tiny-dense"]:
            _positive(row, "hf_tokens_per_s", *(f"{c}_vs_hf" for c in CONTRACTS))


def test_small_cpu_run_of_the_moe_and_mla_sections(tmp_path):
    """The MoE layer (native and grouped_mm on a CPU) and MLA attention (tiny-mla's reference against
    native) in every phase: positive times and outputs that agree within bf16 rounding."""
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "ISOEXEC_COMMIT": "abc1234"}
    command = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--small", "--device", "cpu", "moe", "mla", "--json", str(out)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["moe"] and all(row["native_eager_ms"] > 0 for row in results["moe"])
    phases = [row["phase"] for row in results["mla"]]
    assert phases == ["training", "prefill", "decode", "decode"]
    for row in results["mla"]:
        _positive(row, "contract_ms", "native_ms", "contract_vs_native")
        assert row["contract_max_abs_diff_vs_native"] < 0.05, row
    _positive(results["mla"][0], "contract_fwd_bwd_ms", "native_fwd_bwd_ms", "contract_vs_native_fwd_bwd")


def test_contract_suffixes_name_the_same_contract_run_another_way():
    """bench.py's --contracts suffixes (benchmarks/variants.py): +sync, +gluon, +blocks and +walk, in any order, after a
    preset or a file; +gluon turns attention.triton's Gluon tile on, +blocks its spread decode on from one key block,
    +walk the spread decode off, for the `with` block only; +blocks with +walk is refused."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import variants

    from isoexec.ops.attention import gluon_tile, triton_blocks

    assert variants.base("tiny-dense-triton+gluon+sync") == "tiny-dense-triton"
    assert variants.base("tiny-dense-triton+blocks+gluon") == "tiny-dense-triton"
    assert variants.base("contracts/fast.toml+sync") == "contracts/fast.toml"
    assert variants.has("x+gluon+sync", variants.SYNC) and variants.has("x+sync+gluon", variants.GLUON)
    assert not variants.has("x+gluon", variants.SYNC) and not variants.has("x", variants.GLUON)
    before = gluon_tile.ENABLED
    with variants.kernels("tiny-dense-triton+gluon"):
        assert gluon_tile.ENABLED
    assert gluon_tile.ENABLED == before
    with variants.kernels("tiny-dense-triton+sync"):
        assert gluon_tile.ENABLED == before
    blocks_before = triton_blocks.BLOCKS_MIN
    with variants.kernels("tiny-dense-triton+blocks"):
        assert triton_blocks.BLOCKS_MIN == 1 and gluon_tile.ENABLED == before
    assert triton_blocks.BLOCKS_MIN == blocks_before
    assert variants.base("tiny-dense-triton+walk") == "tiny-dense-triton"
    with variants.kernels("tiny-dense-triton+walk"):
        assert triton_blocks.BLOCKS_MIN is None
    assert triton_blocks.BLOCKS_MIN == blocks_before
    with pytest.raises(ValueError, match="contradict"):
        with variants.kernels("tiny-dense-triton+blocks+walk"):
            pass



def test_attention_tiles_runs_packed_prefill_and_decode_in_the_interpreter(tmp_path):
    """benchmarks/attention_tiles.py end to end on the CPU (Triton's interpreter, tiny heads): a packed prefill batch
    (`2x40`) timed as the graph path would be, decode steps, and knobs of both kinds (a module constant, a contract
    constant) each get a row with its time and its bit comparisons (a smoke run: the op's bits are tested in
    tests/ops/attention)."""
    pytest.importorskip("triton")
    out = tmp_path / "tiles.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    command = [sys.executable, "attention_tiles.py", "--device", "cpu", "--graphs", "--heads", "4,2,16", "--prefill", "2x40",
               "--decode", "2x70", "--variants", "heads_fastest=0,max_run=1;block_n=16", "--out", str(out)]
    done = subprocess.run(command, env=env, cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    header, prefill, decode = out.read_text().splitlines()
    assert "heads_fastest True" in header and "max_run 2" in header
    assert prefill.startswith("prefill 2 x 40") and decode.startswith("decode batch 2")
    for row, compared, count in ((prefill, "decode=prefill", 3), (decode, "preset's bits", 2)):
        assert row.count(compared) == count and "[heads_fastest=0,max_run=1]" in row and "[block_n=16]" in row, row
    # Key blocks of 16 re-block the online softmax: the fp32 outputs show it in prefill and decode alike, the launch
    # knobs move no bit.
    same_launch, other_blocks = (re.search(r"moved (\d+) \(fp32 out (\d+)\)", part) for part in prefill.split("[")[1:])
    assert same_launch.groups() == ("0", "0") and int(other_blocks.group(2)) > 0, prefill
    assert "[heads_fastest=0,max_run=1]" in decode.split("preset's bits True")[0] and "preset's bits False" in decode, decode
