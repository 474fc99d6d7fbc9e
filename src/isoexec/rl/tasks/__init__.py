"""Verifiable tasks: a prompt source and an exact-match reward, over the built-in toy's character
tokenizer or a checkpoint's own (`tokenizer.py`).

A task read from a data file keeps its examples (`Task.examples`), so that `checks.py` can hold them
against the run that will use them before any work starts.
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .tokenizer import CharTokenizer, CheckpointTokenizer


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    line: int | None = None  # the line of the data file it was read from


@dataclass(frozen=True)
class Task:
    """`sample(rng, n)` draws n examples; `reward(example, completion)` scores a decoded completion."""

    name: str
    tokenizer: CharTokenizer | CheckpointTokenizer
    sample: Callable[[random.Random, int], list[Example]]
    reward: Callable[[Example, str], float]
    examples: tuple[Example, ...] = ()  # the whole data set of a task read from a file; () for generated ones
    prompts: tuple[str, ...] = ()  # every prompt `sample` can draw, each once (the engine is sized for the longest)
    answers: tuple[str, ...] = ()  # a generated task's every answer, each once (each must fit max_new_tokens)

    def keeping(self, examples) -> "Task":
        """This task drawing from `examples` only (same name, tokenizer and reward)."""
        examples = tuple(examples)
        return Task(self.name, self.tokenizer, _draw_from(examples), self.reward, examples, _prompts_of(examples))


def exact_match(example: Example, completion: str) -> float:
    return 1.0 if completion == example.answer else 0.0


def stripped_match(example: Example, completion: str) -> float:
    """Exact match once surrounding whitespace is stripped: a checkpoint's tokenizer may start the
    completion with a space or a newline that the answer in the data does not have."""
    return 1.0 if completion.strip() == example.answer.strip() else 0.0


ADDITION_DIGITS = "0123456789"


def addition(max_operand: int = 9, tokenizer: CheckpointTokenizer | None = None) -> Task:
    """"a+b=" → the decimal sum: small enough for a tiny model on a CPU, hard enough to improve on.
    Over `tokenizer` (a checkpoint's) when given, with `stripped_match`; else over its digits."""

    def sample(rng: random.Random, n: int) -> list[Example]:
        pairs = [(rng.randint(0, max_operand), rng.randint(0, max_operand)) for _ in range(n)]
        return [Example(f"{a}+{b}=", str(a + b)) for a, b in pairs]

    prompts = tuple(f"{a}+{b}=" for a in range(max_operand + 1) for b in range(max_operand + 1))
    answers = tuple(str(total) for total in range(2 * max_operand + 1))
    if tokenizer is not None:
        return Task("addition", tokenizer, sample, stripped_match, prompts=prompts, answers=answers)
    return Task("addition", CharTokenizer(ADDITION_DIGITS + "+="), sample, exact_match, prompts=prompts, answers=answers)


def jsonl(path: str | Path, tokenizer: CheckpointTokenizer | None = None) -> Task:
    """Users' own data: one {"prompt": ..., "answer": ...} object per line. Over `tokenizer` (a
    checkpoint's) when given, with `stripped_match`; else over a character tokenizer covering the
    characters of the file, with `exact_match`."""
    path = Path(path)
    records = read_jsonl(path, ("prompt", "answer"), what="examples", label="data file ")
    examples = tuple(Example(str(record["prompt"]), str(record["answer"]), number) for number, record in records)
    name, sample, prompts = f"jsonl:{path.name}", _draw_from(examples), _prompts_of(examples)
    if tokenizer is not None:
        return Task(name, tokenizer, sample, stripped_match, examples, prompts)
    alphabet = sorted({c for e in examples for c in e.prompt + e.answer})
    return Task(name, CharTokenizer("".join(alphabet)), sample, exact_match, examples, prompts)


def read_jsonl(path: Path, keys: tuple[str, ...], *, what: str, label: str = "") -> list[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSONL file whose objects hold `keys`.
    ValueError, naming `label` + the path (and the line), for a file that cannot be read, a line that
    is not such an object, or a file of no `what`."""
    try:
        # "\n" only: splitlines() also splits at U+2028 and other characters a JSON string may hold,
        # which would shift the line numbers that errors and checks report.
        lines = path.read_text("utf-8").split("\n")
    except FileNotFoundError:
        raise ValueError(f"{label}{path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{label}{path} is a directory") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{label}{path} is unreadable: {error}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not all(key in record for key in keys):
                raise KeyError
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}:{number}: expected a JSON object with " + " and ".join(f'"{k}"' for k in keys)) from None
        records.append((number, record))
    if not records:
        raise ValueError(f"{label}{path} holds no {what}")
    return records


def _draw_from(examples: tuple[Example, ...]) -> Callable[[random.Random, int], list[Example]]:
    def sample(rng: random.Random, n: int) -> list[Example]:
        return [examples[rng.randrange(len(examples))] for _ in range(n)]

    return sample


def _prompts_of(examples) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.prompt for e in examples))


TASKS = {"addition": addition}


def load_task(name: str, data: str | None = None, tokenizer: CheckpointTokenizer | None = None) -> Task:
    """The task `name` (with `data` for "jsonl"), over `tokenizer` when given (a checkpoint's)."""
    if name == "jsonl":
        if not data:
            raise ValueError('task "jsonl" needs a data file (--data FILE)')
        return jsonl(data, tokenizer)
    if name not in TASKS:
        raise ValueError(f'unknown task "{name}" (known: {", ".join([*TASKS, "jsonl"])})')
    return TASKS[name](tokenizer=tokenizer)
