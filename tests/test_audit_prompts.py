"""`isoexec audit --model DIR --prompts FILE`: the workload's prompts are the file's, encoded with the
checkpoint's own tokenizer (through its chat template unless --no-chat-template), still bitwise equal
under the contract and still seen to differ under a batch-dependent control; bad prompts and a model
without a tokenizer are one line and exit 2. The checkpoint is built by the test (`checkpoints.py`)."""

import json
import sys

import pytest

from conftest import isoexec_here
from checkpoints import MAX_POSITION_EMBEDDINGS, build_tokenizer, write_checkpoint
from controls import control_contract
from isoexec.audit import all_equal, run_audit
from isoexec.audit.workload import file_prompts
from isoexec.cli import EXIT_INPUT_ERROR, main
from isoexec.contract import load_preset
from isoexec.model import load_model
from isoexec.contract import fit_contract
from isoexec.rl.tasks.tokenizer import CheckpointTokenizer

# Line 3 is blank and skipped; line 5 is longer than two attention blocks, so its prefill is chunked.
LINES = ['{"prompt": "3+4="}', '{"prompt": "what is 2+2?", "answer": "4"}', "", '{"prompt": "1+1="}',
         json.dumps({"prompt": "count " + "1 2 3 4 5 6 7 8 9 " * 2})]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit_prompts")
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(LINES) + "\n", "utf-8")
    return dict(model=str(write_checkpoint(root / "model")), raw=str(write_checkpoint(root / "raw", chat_template=False)),
                prompts=str(prompts), root=root)


def texts() -> list[str]:
    return [json.loads(line)["prompt"] for line in LINES if line]


def audit_json(tmp_path, *args) -> dict:
    out = tmp_path / "audit.json"
    assert main(["audit", "--quiet", "--max-new-tokens", "4", "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_the_files_prompts_through_the_chat_template_are_bitwise_equal(made, tmp_path):
    pytest.importorskip("transformers")
    tokenizer = CheckpointTokenizer(made["model"])
    encoded = [tokenizer.encode_prompt(text) for text in texts()]
    report = audit_json(tmp_path, "--model", made["model"], "--prompts", made["prompts"], "--requests", "6")
    assert all_equal(report) and report["tokens"] == 6 * 4 and report["requests"] == 6
    assert report["prompt_token_ids"] == [encoded[i % 4] for i in range(6)]  # cycled through the file's four prompts
    assert report["engine"]["prefill_chunks"] > 6  # the long prompt was chunked
    raw = audit_json(tmp_path, "--model", made["model"], "--prompts", made["prompts"], "--no-chat-template")
    assert raw["requests"] == 4 and raw["prompt_token_ids"] == [build_tokenizer().encode(text).ids for text in texts()]
    assert all_equal(raw)


def test_without_transformers_a_checkpoint_without_a_template_is_audited_on_its_prompts(made, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    report = audit_json(tmp_path, "--model", made["raw"], "--prompts", made["prompts"])
    assert all_equal(report) and report["prompt_token_ids"] == [build_tokenizer().encode(text).ids for text in texts()]


def test_a_control_contract_is_seen_to_differ_on_the_files_prompts(made):
    """The comparison is not vacuous on file prompts: a linear whose reduction order follows the batch differs."""
    model = load_model(made["raw"])
    prompts = file_prompts(made["prompts"], CheckpointTokenizer(made["raw"]), max_length=MAX_POSITION_EMBEDDINGS, max_new_tokens=8)
    report = run_audit(model, fit_contract(control_contract("linear"), model.spec), requests=8, max_new_tokens=8, progress=False,
                       prompts=prompts)
    assert report["prompt_token_ids"][:4] == prompts and not all_equal(report)
    same = run_audit(model, fit_contract(load_preset("tiny-dense"), model.spec), requests=8, max_new_tokens=8, progress=False,
                     prompts=prompts)
    assert all_equal(same)


def _write(root, name, lines) -> str:
    path = root / name
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return str(path)


ERRORS = {
    "a-preset-has-no-tokenizer": (["--prompts", "{prompts}"], "--prompts needs a checkpoint directory for --model"),
    "prompts-too-long": (["--model", "{raw}", "--prompts", "{long}", "--max-new-tokens", "16"],
                         f"--prompts {{long}}: 3 of the 4 prompts cannot run: 2 with a prompt of more than {MAX_POSITION_EMBEDDINGS - 16} "
                         f"tokens = the model's length {MAX_POSITION_EMBEDDINGS} - max_new_tokens 16 (lines 2, 4); "
                         "1 with an empty prompt (line 3)"),
    "not-a-prompt": (["--model", "{raw}", "--prompts", "{bad}"], '--prompts {bad}:2: expected a JSON object with "prompt"'),
    "no-tokenizer": (["--model", "{bare}", "--prompts", "{prompts}"], "--model {bare}: no tokenizer (none of tokenizer.json"),
    "no-chat-template-without-prompts": (["--no-chat-template"], "--no-chat-template applies to --prompts only"),
    "prompts-missing": (["--model", "{raw}", "--prompts", "{root}/nope.jsonl"], "--prompts {root}/nope.jsonl does not exist"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_bad_prompts_are_one_line_and_exit_2(made, capsys, name):
    root = made["root"]
    places = {**made, "long": _write(root, "long.jsonl", ['{"prompt": "1+1="}', json.dumps({"prompt": "1" * 49}), '{"prompt": ""}',
                                                          json.dumps({"prompt": "2" * 60})]),
              "bad": _write(root, "bad.jsonl", ['{"prompt": "1+1="}', '{"answer": "2"}']),
              "bare": str(write_checkpoint(root / "bare", tokenizer_files=False))}
    args, message = ERRORS[name]
    result = isoexec_here(capsys, "audit", "--quiet", *[a.format(**places) for a in args])
    assert result.returncode == EXIT_INPUT_ERROR, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("isoexec: error: ") and message.format(**places) in line, line
