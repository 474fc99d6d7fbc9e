"""Verifiable tasks: a prompt source and an exact-match reward, over a small character tokenizer.

A task read from a data file keeps its examples (`Task.examples`), so that `checks.py` can hold them
against the run that will use them before any work starts.
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .tokenizer import CharTokenizer


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    line: int | None = None  # the line of the data file it was read from


@dataclass(frozen=True)
class Task:
    """`sample(rng, n)` draws n examples; `reward(example, completion)` scores a decoded completion."""

    name: str
    tokenizer: CharTokenizer
    sample: Callable[[random.Random, int], list[Example]]
    reward: Callable[[Example, str], float]
    examples: tuple[Example, ...] = ()  # the whole data set of a task read from a file; () for generated ones

    def keeping(self, examples) -> "Task":
        """This task drawing from `examples` only (same name, tokenizer and reward)."""
        examples = tuple(examples)
        return Task(self.name, self.tokenizer, _draw_from(examples), self.reward, examples)


def exact_match(example: Example, completion: str) -> float:
    return 1.0 if completion == example.answer else 0.0


ADDITION_DIGITS = "0123456789"


def addition(max_operand: int = 9) -> Task:
    """"a+b=" → the decimal sum: small enough for a tiny model on a CPU, hard enough to improve on."""

    def sample(rng: random.Random, n: int) -> list[Example]:
        pairs = [(rng.randint(0, max_operand), rng.randint(0, max_operand)) for _ in range(n)]
        return [Example(f"{a}+{b}=", str(a + b)) for a, b in pairs]

    return Task("addition", CharTokenizer(ADDITION_DIGITS + "+="), sample, exact_match)


def jsonl(path: str | Path) -> Task:
    """Users' own data: one {"prompt": ..., "answer": ...} object per line, exact-match reward.
    The tokenizer covers the characters of the file."""
    path = Path(path)
    try:
        # "\n" only: splitlines() also splits at U+2028 and other characters a JSON string may hold,
        # which would shift the line numbers that errors and checks report.
        lines = path.read_text("utf-8").split("\n")
    except FileNotFoundError:
        raise ValueError(f"data file {path} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"data file {path} is a directory") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"data file {path} is unreadable: {error}") from None
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            examples.append(Example(str(record["prompt"]), str(record["answer"]), number))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f'{path}:{number}: expected a JSON object with "prompt" and "answer"') from None
    if not examples:
        raise ValueError(f"data file {path} holds no examples")
    alphabet = sorted({c for e in examples for c in e.prompt + e.answer})
    examples = tuple(examples)
    return Task(f"jsonl:{path.name}", CharTokenizer("".join(alphabet)), _draw_from(examples), exact_match, examples)


def _draw_from(examples: tuple[Example, ...]) -> Callable[[random.Random, int], list[Example]]:
    def sample(rng: random.Random, n: int) -> list[Example]:
        return [examples[rng.randrange(len(examples))] for _ in range(n)]

    return sample


TASKS = {"addition": addition}


def load_task(name: str, data: str | None = None) -> Task:
    if name == "jsonl":
        if not data:
            raise ValueError('task "jsonl" needs a data file (--data FILE)')
        return jsonl(data)
    if name not in TASKS:
        raise ValueError(f'unknown task "{name}" (known: {", ".join([*TASKS, "jsonl"])})')
    return TASKS[name]()
