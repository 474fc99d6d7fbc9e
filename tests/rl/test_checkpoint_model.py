"""RL on a Hugging Face checkpoint (`--model DIR`) with the checkpoint's own tokenizer: the gate passes
and the weights train, a resumed run ends bitwise identical, the demo writes its outputs, prompts go
through the chat template (or raw), data is checked in the checkpoint's tokens and length, and a
checkpoint without a readable tokenizer is one line and exit 2. The checkpoint and its tokenizer are
built by the test (`tests/checkpoints.py`)."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping

import pytest

from checkpoints import ASSISTANT, EOS, MAX_POSITION_EMBEDDINGS, USER, build_tokenizer, write_checkpoint, write_data
from conftest import bitwise_equal, isoexec_here
from isoexec.cli import EXIT_INPUT_ERROR
from isoexec.model import load as load_checkpoint
from isoexec.rl import RLConfig, RLRun
from isoexec.rl.checkpoint import checkpoints, config_differences, latest, load
from isoexec.rl.handshake import ensure_admitted
from isoexec.rl.loop import Rollout, setup, usable_task
from isoexec.rl.sync import weights_digest
from isoexec.rl.tasks.checks import DataError
from isoexec.rl.tasks.tokenizer import CheckpointTokenizer
from isoexec.rl.train import train

ROWS = [("3+4=", "7"), ("what is 2+2?", "4"), ("1+1=", "2")]
TINY = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "4", "--quiet"]
DEMO = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--quiet"]
# GRPO trains on every group, and a few warm-up steps on the answers make some completions right and
# others wrong: rewards that differ within a group, so the update moves the weights.
LEARNING = dict(algorithm="grpo", warmup_steps=5, prompts_per_step=2, group_size=4, max_new_tokens=4)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A checkpoint with a chat template, one without, the data, and an ISOEXEC_HOME admitting the contract
    at the checkpoint's shapes (for the module's subprocesses too)."""
    root = tmp_path_factory.mktemp("made")
    home = root / "home"
    model, raw = write_checkpoint(root / "model"), write_checkpoint(root / "raw", chat_template=False)
    data = write_data(root / "data.jsonl", ROWS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ISOEXEC_HOME", str(home))
        _, spec, contract = setup(RLConfig(model=str(raw), task="jsonl", data=str(data)))
        ensure_admitted(contract, spec=spec)
    return dict(model=str(model), raw=str(raw), data=str(data), home=str(home), root=root)


@pytest.fixture(autouse=True)
def _admitted_home(_isoexec_home, made, monkeypatch):
    monkeypatch.setenv("ISOEXEC_HOME", made["home"])


def isoexec(*args, prelude: str = "pass"):
    """The CLI in a subprocess; `prelude` runs first (to hide transformers, say)."""
    script = f"import sys; {prelude}; from isoexec.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, env=os.environ)


def config(made, **changes) -> RLConfig:
    return RLConfig(**{"model": made["raw"], "task": "jsonl", "data": made["data"], **changes})


def test_train_on_a_checkpoint_passes_the_gate_and_moves_its_weights(made, tmp_path):
    pytest.importorskip("transformers")  # the checkpoint's chat template
    run, out = tmp_path / "run", tmp_path / "last.json"
    result = isoexec("train", "--model", made["model"], "--task", "jsonl", "--data", made["data"], "--algorithm", "grpo",
                     "--warmup-steps", "5", *TINY, "--checkpoint-dir", str(run), "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = json.loads(out.read_text())
    assert metrics["kept_groups"] > 0 and metrics["tokens"] > 0
    assert metrics["bitwise_equal_fraction"] == 1.0 and metrics["full_vocab_rows_bitwise_equal_fraction"] == 1.0
    assert metrics["rollout_train_logprob_abs_diff_max"] == 0.0
    before, after = (load(path) for path in checkpoints(run).values())
    assert (before["step"], after["step"]) == (0, 1) and before["weights_sha256"] != after["weights_sha256"]
    assert after["weights_sha256"] == metrics["weights_sha256"]
    assert before["config"]["model"] == made["model"]


def test_policy_and_engine_start_from_the_checkpoint_in_float32(made):
    cfg = config(made)
    assert cfg.num_warmup_steps == 0 and RLConfig().num_warmup_steps == 40
    run = RLRun(cfg)
    expected = load_checkpoint(made["raw"], dtype="float32")
    policy = run.learner.policy
    assert policy.spec == expected.spec and policy.spec.dtype == "float32"
    assert all(bitwise_equal(policy.state_dict()[k], v) for k, v in expected.state_dict().items())
    assert run.weights == weights_digest(expected) == weights_digest(run.rollout.model)


def test_a_resumed_run_on_a_checkpoint_ends_bitwise_identical(made, tmp_path):
    straight = train(config(made, **LEARNING, steps=2, checkpoint_dir=str(tmp_path / "straight")), progress=False)
    train(config(made, **LEARNING, steps=1, checkpoint_dir=str(tmp_path / "resumed")), progress=False)
    resumed = train(config(made, **LEARNING, steps=2, checkpoint_dir=str(tmp_path / "resumed")), progress=False)
    a, b = load(latest(tmp_path / "straight")), load(latest(tmp_path / "resumed"))
    assert a["step"] == b["step"] == 2 and a["weights_sha256"] == b["weights_sha256"] == straight.weights == resumed.weights
    assert all(bitwise_equal(a["policy"][k], b["policy"][k]) for k in a["policy"])
    timeless = [[{k: v for k, v in m.items() if not k.endswith("_seconds")} for m in h] for h in (a["history"], b["history"])]
    assert timeless[0] == timeless[1] and any("loss" in m for m in timeless[0]), "no step was trained on"


def test_a_toy_checkpoint_written_before_these_fields_stays_resumable(made):
    """Older checkpoints hold no model and no_chat_template, and warmup_steps 40 where the config now says None."""
    saved = {k: v for k, v in dataclasses.asdict(RLConfig(warmup_steps=40)).items() if k not in ("model", "no_chat_template")}
    assert config_differences(saved, RLConfig()) == []
    assert config_differences(saved, RLConfig(warmup_steps=40)) == []
    assert config_differences(saved, RLConfig(warmup_steps=0)) == ["warmup_steps: checkpoint 40, now 0"]
    assert config_differences(saved, RLConfig(model=made["raw"])) == [f"model: checkpoint None, now {made['raw']!r}",
                                                                      "warmup_steps: checkpoint 40, now 0"]


def test_demo_on_a_checkpoint_runs_the_embedded_task_and_writes_its_outputs(made, tmp_path):
    out, summary = tmp_path / "demo", tmp_path / "summary.json"
    result = isoexec("demo", "--model", made["raw"], *DEMO, "--out", str(out), "--json", str(summary))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["log.jsonl", "plot.png", "summary.json"]
    assert [json.loads(line)["path"] for line in (out / "log.jsonl").read_text().splitlines()] == ["contract", "native"]
    written = json.loads(summary.read_text())
    assert written["config"]["model"] == made["raw"] and written["config"]["task"] == "addition"
    assert written["contract"]["steps_with_mismatch"] == 0
    assert f"policy: {made['raw']} in float32, prompts sent as raw text" in result.stdout


def _ids(text: str) -> list[int]:
    """The test tokenizer's ids of `text`, one a character."""
    return build_tokenizer().encode(text, add_special_tokens=False).ids


def test_prompts_go_through_the_chat_template_or_raw(made):
    transformers = pytest.importorskip("transformers")
    tokenizer = build_tokenizer()
    own = transformers.AutoTokenizer.from_pretrained(made["model"], local_files_only=True)
    for text in ("3+4=", "what is 2+2?"):
        rendered = own.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        rendered = rendered["input_ids"] if isinstance(rendered, Mapping) else rendered
        assert rendered == [tokenizer.token_to_id(USER), *_ids(text), tokenizer.token_to_id(ASSISTANT)]
        assert CheckpointTokenizer(made["model"]).encode_prompt(text) == rendered
        assert CheckpointTokenizer(made["model"], chat_template=False).encode_prompt(text) == _ids(text)
        assert CheckpointTokenizer(made["raw"]).encode_prompt(text) == _ids(text)
    # and the loop sends exactly these
    cfg = config(made, model=made["model"], prompts_per_step=2, group_size=2)
    examples, prompts, params = RLRun(cfg).requests()
    assert prompts == [CheckpointTokenizer(made["model"]).encode_prompt(e.prompt) for e in examples for _ in range(2)]
    assert {p.stop_token_ids for p in params} == {(tokenizer.token_to_id(EOS),)}
    _, raw, _ = RLRun(cfg.replace(no_chat_template=True)).requests()
    assert raw == [_ids(e.prompt) for e in examples for _ in range(2)]


def test_the_tokenizers_library_reads_the_checkpoint_without_transformers(made, monkeypatch):
    """The fallback: tokenizer.json through the tokenizers library; the eos from tokenizer_config.json
    when config.json names none; a completion decoded up to its eos."""
    fallback = CheckpointTokenizer(made["raw"], backend="tokenizers")
    eos = build_tokenizer().token_to_id(EOS)
    assert fallback.vocab_size == build_tokenizer().get_vocab_size() and fallback.EOS == eos and not fallback.uses_chat_template
    assert fallback.encode("12") == fallback.encode_prompt("12") == _ids("12")
    assert fallback.decode([*_ids("12"), eos, *_ids("3")]) == "12"
    # config.json's eos comes first; the tokenizer's own, where it differs, ends a completion too
    other = CheckpointTokenizer(made["raw"], eos_token_id=3, backend="tokenizers")
    assert other.EOS == 3 and other.eos_token_ids == (3, eos) and other.decode([*_ids("12"), 3, *_ids("3")]) == "12"
    with pytest.raises(ValueError) as refused:
        CheckpointTokenizer(made["model"], backend="tokenizers")
    assert "has a chat template, which needs transformers" in str(refused.value) and "--no-chat-template" in str(refused.value)
    assert CheckpointTokenizer(made["model"], backend="tokenizers", chat_template=False).encode_prompt("1+1=") == _ids("1+1=")
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails: the automatic choice
    assert CheckpointTokenizer(made["raw"]).encode_prompt("3+4=") == _ids("3+4=")
    with pytest.raises(ValueError, match="has a chat template"):
        CheckpointTokenizer(made["model"])


def test_data_is_checked_in_the_checkpoints_tokens_after_its_template(made, tmp_path):
    """Line 3 fits the checkpoint's length as raw text but not with the template's two tokens around it
    (the toy's length would take it); line 4's answer is longer than max_new_tokens = 3 in its tokens."""
    pytest.importorskip("transformers")
    max_prompt = MAX_POSITION_EMBEDDINGS - 4
    rows = [("1+1=", "2"), ("1" * (max_prompt - 2), "1"), ("1" * (max_prompt - 1), "1"), ("2+2=", "four")]
    cfg = config(made, model=made["model"], data=str(write_data(tmp_path / "d.jsonl", rows)), max_new_tokens=4)
    with pytest.raises(DataError) as refused:
        usable_task(cfg)
    assert str(refused.value) == (f"1 of the 4 examples of d.jsonl cannot be trained on: 1 with a prompt of more than {max_prompt} "
                                  f"tokens = the model's length {MAX_POSITION_EMBEDDINGS} - max_new_tokens 4 (line 3) "
                                  "(--skip-bad-examples drops them)")
    assert usable_task(cfg.replace(no_chat_template=True))[1] is None
    with pytest.raises(DataError, match=r"^1 of the 4 .* 1 with an answer of more than max_new_tokens = 3 tokens \(line 4\)"):
        usable_task(cfg.replace(max_new_tokens=3))
    # the embedded task has no lines to name: "a+b=" and the template's two tokens, 6 in all
    addition = config(made, model=made["model"], task="addition", data=None)
    assert usable_task(addition.replace(max_new_tokens=MAX_POSITION_EMBEDDINGS - 6))[1] is None
    with pytest.raises(DataError, match=rf"^task addition: its prompts take up to 6 tokens, more than 5 = the model's length "
                                        rf"{MAX_POSITION_EMBEDDINGS} - max_new_tokens {MAX_POSITION_EMBEDDINGS - 5}$"):
        usable_task(addition.replace(max_new_tokens=MAX_POSITION_EMBEDDINGS - 5))


def test_the_engine_is_sized_for_the_longest_prompt(made, tmp_path):
    data = write_data(tmp_path / "d.jsonl", [("1+1=", "2"), ("1" * 40, "1")])
    cfg = config(made, data=str(data), prompts_per_step=2, group_size=2, max_new_tokens=4)
    rollout = Rollout(cfg)
    page = rollout.contract.deployment.engine.kv_page_size
    assert rollout.engine.config.num_pages == 2 * 2 * math.ceil((40 + 4) / page) + 1


def broken_checkpoints(root) -> dict[str, str]:
    missing = write_checkpoint(root / "no-tokenizer", tokenizer_files=False)
    junk = write_checkpoint(root / "junk-tokenizer", chat_template=False)
    (junk / "tokenizer.json").write_text("{not json", "utf-8")
    return {"missing": str(missing), "junk": str(junk)}


HIDE_TRANSFORMERS = "sys.modules['transformers'] = None"
ERRORS = {
    "train-no-tokenizer": (["train", "--model", "{missing}", *TINY], "pass", "{missing}: no tokenizer (none of tokenizer.json"),
    "demo-junk-tokenizer": (["demo", "--model", "{junk}", *TINY], "pass", "{junk}: unreadable tokenizer ("),
    "train-junk-tokenizer-without-transformers": (["train", "--model", "{junk}", *TINY], HIDE_TRANSFORMERS,
                                                  "{junk}/tokenizer.json: unreadable tokenizer ("),
    "train-template-without-transformers": (["train", "--model", "{model}", *TINY], HIDE_TRANSFORMERS,
                                            "{model} has a chat template, which needs transformers"),
    "no-chat-template-without-a-model": (["train", "--no-chat-template", *TINY], "pass", "no_chat_template applies to a checkpoint's"),
    "model-not-there": (["train", "--model", "{model}/nope", *TINY], "pass", "model {model}/nope does not exist"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_a_checkpoint_without_a_readable_tokenizer_is_one_line_and_exit_2(made, capsys, name):
    """In a process where transformers must be hidden, in this one otherwise (`isoexec_here`)."""
    args, prelude, message = ERRORS[name]
    places = {**broken_checkpoints(made["root"] / name), "model": made["model"]}
    args = [a.format(**places) for a in args]
    result = isoexec(*args, prelude=prelude) if prelude != "pass" else isoexec_here(capsys, *args)
    assert result.returncode == EXIT_INPUT_ERROR, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("isoexec: error: ") and message.format(**places) in line, line
    assert "warm-up" not in result.stdout + result.stderr


def test_the_checkpoints_eos_ends_a_completion_and_its_decoded_text(made):
    """config.json's eos (ModelSpec) stops the engine; the decoded completion is cut there."""
    run = RLRun(config(made))
    eos = build_tokenizer().token_to_id(EOS)
    completions = run.rollout.generate(*run.requests()[1:])
    stopped = [c for c in completions if c.finish_reason == "stop"]
    assert stopped and all(c.token_ids[-1] == eos and eos not in c.token_ids[:-1] for c in stopped)
    assert all(run.task.tokenizer.decode(c.token_ids) == build_tokenizer().decode(c.token_ids[:-1], skip_special_tokens=False)
               for c in stopped)
