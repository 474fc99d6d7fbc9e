"""`isoexec parity`: our model against transformers' own implementation on the same weights."""

import json
import sys

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from isoexec import parity  # noqa: E402
from isoexec.cli import _Parser  # noqa: E402
from isoexec.model import dense_fields, dense_spec, init_random, save  # noqa: E402

SMALL = dict(vocab_size=384, intermediate_size=144, num_hidden_layers=2, rms_norm_eps=1e-6, max_position_embeddings=256, dtype="float32")
SPECS = {
    # hidden not a power of two, one KV head, head_dim 40 ≠ 96 / 3, tied embeddings
    "qwen3": dense_spec(architecture="Qwen3ForCausalLM", hidden_size=96, num_attention_heads=3, num_key_value_heads=1, head_dim=40,
                       rope_theta=1e6, tie_word_embeddings=True, **SMALL),
    # q/k/v bias, one KV head, head_dim 24 ≠ 80 / 4, untied
    "qwen2": dense_spec(architecture="Qwen2ForCausalLM", hidden_size=80, num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                       rope_theta=1e6, tie_word_embeddings=False, **SMALL),
    # GQA 4:2, head_dim 32 ≠ 80 / 4, untied, Llama's rope theta
    "llama": dense_spec(architecture="LlamaForCausalLM", hidden_size=80, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       rope_theta=5e5, tie_word_embeddings=False, **SMALL),
}
HF_CONFIGS = {
    "qwen3": dict(hidden_size=80, num_attention_heads=4, num_key_value_heads=1, head_dim=24, tie_word_embeddings=False),
    "qwen2": dict(hidden_size=96, num_attention_heads=3, num_key_value_heads=1, head_dim=40, tie_word_embeddings=True),
    "llama": dict(hidden_size=80, num_attention_heads=5, num_key_value_heads=5, head_dim=16, tie_word_embeddings=True, rope_theta=5e5),
}


@pytest.fixture(scope="module")
def ours_saved(tmp_path_factory):
    """Checkpoints written by our `save` from `init_random`, one per architecture."""
    root = tmp_path_factory.mktemp("ours")
    return {name: save(init_random(spec, seed=1), root / name) for name, spec in SPECS.items()}


@pytest.fixture(scope="module")
def hf_saved(tmp_path_factory):
    """Checkpoints written by transformers' `save_pretrained`, with every parameter randomised (biases included)."""
    root = tmp_path_factory.mktemp("hf")
    generator = torch.Generator().manual_seed(2)
    dirs = {}
    for model_type, extra in HF_CONFIGS.items():
        config = transformers.AutoConfig.for_model(model_type, vocab_size=320, intermediate_size=112, num_hidden_layers=2,
                                                   max_position_embeddings=128, rms_norm_eps=1e-5, **extra)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                noise = torch.randn(param.shape, generator=generator)
                param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.05 * noise)
        model.save_pretrained(root / model_type)
        dirs[model_type] = root / model_type
    return dirs


def _check(report, dtype):
    assert report["dtype"] == dtype and report["passed"], report
    assert len(set(report["sequence_lengths"])) == len(report["sequence_lengths"]) > 1
    if dtype == "float32":
        assert report["measured"]["max_abs_logprob"] <= 1e-4 and report["measured"]["max_rel_logit"] <= 1e-5


@pytest.mark.parametrize("dtype", parity.DTYPES)
@pytest.mark.parametrize("arch", SPECS)
def test_parity_holds_on_our_checkpoints(ours_saved, arch, dtype):
    report = parity.compare(ours_saved[arch], dtype)
    assert report["architecture"] == SPECS[arch].architecture
    _check(report, dtype)


@pytest.mark.parametrize("dtype", parity.DTYPES)
@pytest.mark.parametrize("arch", HF_CONFIGS)
def test_parity_holds_on_checkpoints_saved_by_transformers(hf_saved, arch, dtype):
    _check(parity.compare(hf_saved[arch], dtype), dtype)


def _perturbed(monkeypatch, edit):
    load = parity._load_ours

    def load_and_edit(model_dir, dtype):
        model = load(model_dir, dtype)
        with torch.no_grad():
            edit(model)
        return model

    monkeypatch.setattr(parity, "_load_ours", load_and_edit)


@pytest.mark.parametrize("dtype", parity.DTYPES)
def test_parity_fails_when_one_of_our_weights_is_wrong(ours_saved, monkeypatch, dtype):
    _perturbed(monkeypatch, lambda m: m.model.layers[0].mlp.up_proj.weight[0, 0].add_(0.5))
    report = parity.compare(ours_saved["qwen2"], dtype)
    assert not report["passed"]
    assert report["measured"]["max_abs_logprob"] > 3 * report["tolerance"]["max_abs_logprob"]


def test_float32_parity_sees_a_one_percent_weight_error(ours_saved, monkeypatch):
    _perturbed(monkeypatch, lambda m: m.model.layers[0].self_attn.v_proj.weight.mul_(1.01))
    assert not parity.compare(ours_saved["llama"], "float32")["passed"]


def isoexec_parity(*argv) -> int:
    """`isoexec parity ARGV` in-process, through the parser shape cli.py builds; returns the exit status."""
    parser = _Parser(prog="isoexec")
    parity.add_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser))
    try:
        args = parser.parse_args(["parity", *argv])
    except SystemExit as exit_:
        return exit_.code
    return args.run(args)


def test_cli_passes_prints_a_table_and_writes_json(ours_saved, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert isoexec_parity("--model", str(ours_saved["qwen3"]), "--dtype", "bfloat16", "--json", str(out)) == 0
    printed = capsys.readouterr().out
    assert "max |Δ logprob|" in printed and printed.rstrip().endswith("PASS")
    report = json.loads(out.read_text("utf-8"))
    assert report["passed"] and report["dtype"] == "bfloat16" and report["architecture"] == "Qwen3ForCausalLM"


@pytest.mark.parametrize("preset, contract", [("tiny-moe", "tiny-moe"), ("tiny-mla", "tiny-mla")])
def test_cli_runs_a_family_under_its_own_contract(tmp_path, capsys, preset, contract):
    from isoexec.model import PRESETS

    directory = save(init_random(PRESETS[preset].replace(dtype="float32"), seed=1), tmp_path / preset)
    assert isoexec_parity("--model", str(directory), "--json", str(tmp_path / "report.json")) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")
    assert json.loads((tmp_path / "report.json").read_text("utf-8"))["contract"] == contract


def test_cli_exits_one_outside_tolerance(ours_saved, monkeypatch, capsys):
    _perturbed(monkeypatch, lambda m: m.model.norm.weight.add_(0.05))
    assert isoexec_parity("--model", str(ours_saved["qwen3"])) == 1
    assert "FAIL" in capsys.readouterr().out


def _unsupported(path):
    path.mkdir()
    config = SPECS["llama"].to_hf_config() | {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    (path / "config.json").write_text(json.dumps(config), "utf-8")


def _no_weights(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(SPECS["llama"].to_hf_config()), "utf-8")


def _heads_transformers_refuses(path):
    """Llama with hidden 72 over 5 heads of 16: our model runs it, transformers' config validator refuses it."""
    spec = dense_spec(**{**dense_fields(SPECS["llama"]), "hidden_size": 72, "num_attention_heads": 5, "num_key_value_heads": 1, "head_dim": 16})
    save(init_random(spec, seed=0), path)


@pytest.mark.parametrize("make, expected", [
    (lambda p: None, "no such directory"),
    (lambda p: p.mkdir(), "no config.json"),
    (_no_weights, "no *.safetensors"),
    (_unsupported, "MistralForCausalLM"),
    (_heads_transformers_refuses, "transformers cannot load it: "),  # its wording varies by version
])
def test_cli_bad_input_is_one_line_and_exit_two(tmp_path, capsys, make, expected):
    target = tmp_path / "model"
    make(target)
    assert isoexec_parity("--model", str(target)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("isoexec: error:") and expected in err


def test_cli_without_transformers_names_the_install(ours_saved, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert isoexec_parity("--model", str(ours_saved["qwen3"])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install transformers" in err


def test_cli_rejects_an_unsupported_dtype(ours_saved, capsys):
    assert isoexec_parity("--model", str(ours_saved["qwen3"]), "--dtype", "float16") == 2
    assert "invalid choice" in capsys.readouterr().err
