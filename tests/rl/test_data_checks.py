"""Data the run cannot use is refused (or, with --skip-bad-examples, dropped with a warning) when it is
loaded, before the warm-up, instead of being lost without a word (the engine's "error" completions)."""

import json
import random
import subprocess
import sys

import pytest

from isoexec.rl import RLConfig
from isoexec.rl.loop import task_model_spec, usable_task
from isoexec.rl.tasks import Task, jsonl
from isoexec.rl.tasks.checks import DataError, find_unusable
from isoexec.rl.tasks.tokenizer import CharTokenizer

TINY = ["--steps", "1", "--warmup-steps", "1", "--prompts-per-step", "2", "--group-size", "2"]
MAX_NEW_TOKENS = 6
MAX_PROMPT = task_model_spec(Task("x", CharTokenizer("ab"), None, None), MAX_NEW_TOKENS).max_position_embeddings - MAX_NEW_TOKENS


def isoexec(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "isoexec", *args], capture_output=True, text=True, timeout=timeout)


def write_data(path, rows):
    path.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in rows), "utf-8")
    return path


def mixed_rows():
    """Lines 1-3 usable; 4-11 prompts one token too long; 12 an unreachable answer; 13 an empty prompt."""
    good = [("ab=", "ba"), ("ba=", "ab"), ("aa=", "bb")]
    return good + [("a" * (MAX_PROMPT + 1), "b")] * 8 + [("ab=", "a" * (MAX_NEW_TOKENS + 1)), ("", "a")]


def test_prompts_and_answers_that_cannot_fit_are_named_by_line(tmp_path):
    task = jsonl(write_data(tmp_path / "d.jsonl", mixed_rows()))
    length = MAX_PROMPT + MAX_NEW_TOKENS
    kinds = find_unusable(task, max_length=length, max_new_tokens=MAX_NEW_TOKENS)
    assert [[e.line for e in kind.examples] for kind in kinds] == [list(range(4, 12)), [12], [13]]
    config = RLConfig(task="jsonl", data=str(tmp_path / "d.jsonl"), max_new_tokens=MAX_NEW_TOKENS)
    with pytest.raises(DataError) as refused:
        usable_task(config)
    message = str(refused.value)
    assert message.startswith("10 of the 13 examples of d.jsonl cannot be trained on")
    assert f"8 with a prompt of more than {MAX_PROMPT} tokens" in message and "(lines 4, 5, 6, 7, 8 … 3 more)" in message
    assert f"1 with an answer of more than max_new_tokens = {MAX_NEW_TOKENS} tokens (line 12)" in message
    assert "1 with an empty prompt (line 13)" in message and "--skip-bad-examples" in message


def test_skipping_keeps_only_the_usable_examples(tmp_path):
    config = RLConfig(task="jsonl", data=str(write_data(tmp_path / "d.jsonl", mixed_rows())), skip_bad_examples=True)
    task, note = usable_task(config)
    assert note.startswith("dropped 10 of the 13 examples of d.jsonl: ")
    assert [e.line for e in task.examples] == [1, 2, 3]
    assert {e.line for e in task.sample(random.Random(0), 200)} == {1, 2, 3}
    untouched, none = usable_task(config.replace(data=str(write_data(tmp_path / "ok.jsonl", mixed_rows()[:3]))))
    assert none is None and [e.line for e in untouched.examples] == [1, 2, 3]


def test_lengths_are_counted_in_tokens_of_the_tasks_tokenizer(tmp_path):
    """A tokenizer with two characters a token: a prompt of 2 * MAX_PROMPT characters fits, one more token does not."""

    class PairTokenizer(CharTokenizer):
        def encode(self, text):
            return [self._ids[text[i]] for i in range(0, len(text), 2)]

    task = jsonl(write_data(tmp_path / "d.jsonl", [("a" * 2 * MAX_PROMPT, "b" * 2 * MAX_NEW_TOKENS), ("a" * (2 * MAX_PROMPT + 1), "b")]))
    task = Task(task.name, PairTokenizer(task.tokenizer.alphabet), task.sample, task.reward, task.examples)
    [kind] = find_unusable(task, max_length=MAX_PROMPT + MAX_NEW_TOKENS, max_new_tokens=MAX_NEW_TOKENS)
    assert "prompt" in kind.problem and [e.line for e in kind.examples] == [2]


@pytest.mark.parametrize("command", ["train", "demo"])
def test_bad_data_is_refused_before_the_warm_up(tmp_path, command):
    data = write_data(tmp_path / "d.jsonl", mixed_rows())
    result = isoexec(command, "--task", "jsonl", "--data", str(data), *TINY, "--out" if command == "demo" else "--quiet",
                     *([str(tmp_path / "out")] if command == "demo" else []))
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("isoexec: error: 10 of the 13 examples of d.jsonl cannot be trained on") and "lines 4, 5" in line
    assert "warm-up" not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_skip_bad_examples_drops_them_with_a_one_line_warning(tmp_path):
    data = write_data(tmp_path / "d.jsonl", mixed_rows())
    out = tmp_path / "last.json"
    # native and GRPO: no admission battery to run, and every group is trained on
    result = isoexec("train", "--task", "jsonl", "--data", str(data), "--skip-bad-examples", "--contract", "native",
                     "--algorithm", "grpo", *TINY, "--quiet", "--json", str(out))
    assert result.returncode == 0, result.stderr
    [warning] = result.stderr.strip().splitlines()
    assert warning.startswith("isoexec: warning: dropped 10 of the 13 examples of d.jsonl: 8 with a prompt")
    assert json.loads(out.read_text())["kept_groups"] == 2


def test_nothing_left_after_skipping_is_an_error(tmp_path):
    data = write_data(tmp_path / "d.jsonl", mixed_rows()[3:])
    result = isoexec("train", "--task", "jsonl", "--data", str(data), "--skip-bad-examples", *TINY, "--quiet")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("isoexec: error: none of the 10 examples of d.jsonl can be trained on: 8 with a prompt")


def test_an_embedded_tasks_answers_that_max_new_tokens_cannot_reach_are_refused():
    """addition's sums 10..18 take two tokens: with one new token no completion could ever match them."""
    with pytest.raises(DataError, match="task addition: 9 of its 19 answers take more than max_new_tokens = 1 tokens"):
        usable_task(RLConfig(task="addition", max_new_tokens=1))
    task, dropped = usable_task(RLConfig(task="addition", max_new_tokens=2))
    assert task.name == "addition" and dropped is None
