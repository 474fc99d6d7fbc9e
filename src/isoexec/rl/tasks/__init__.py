"""Verifiable tasks: a prompt source and an exact-match reward, over a small character tokenizer."""

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


@dataclass(frozen=True)
class Task:
    """`sample(rng, n)` draws n examples; `reward(example, completion)` scores a decoded completion."""

    name: str
    tokenizer: CharTokenizer
    sample: Callable[[random.Random, int], list[Example]]
    reward: Callable[[Example, str], float]


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
        lines = path.read_text("utf-8").splitlines()
    except FileNotFoundError:
        raise ValueError(f"data file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"data file {path} is unreadable: {error}") from None
    examples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            examples.append(Example(str(record["prompt"]), str(record["answer"])))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f'{path}:{number}: expected a JSON object with "prompt" and "answer"') from None
    if not examples:
        raise ValueError(f"data file {path} holds no examples")
    alphabet = sorted({c for e in examples for c in e.prompt + e.answer})

    def sample(rng: random.Random, n: int) -> list[Example]:
        return [examples[rng.randrange(len(examples))] for _ in range(n)]

    return Task(f"jsonl:{path.name}", CharTokenizer("".join(alphabet)), sample, exact_match)


TASKS = {"addition": addition}


def load_task(name: str, data: str | None = None) -> Task:
    if name == "jsonl":
        if not data:
            raise ValueError('task "jsonl" needs a data file (--data FILE)')
        return jsonl(data)
    if name not in TASKS:
        raise ValueError(f'unknown task "{name}" (known: {", ".join([*TASKS, "jsonl"])})')
    return TASKS[name]()
