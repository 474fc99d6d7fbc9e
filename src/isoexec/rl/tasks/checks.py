"""A task's data held against the run that will use it, when it is loaded, before any work starts.

The engine answers a request it cannot run with an "error" completion, and dynamic sampling drops a
group whose rewards are all equal, so an example the run cannot use is lost without a word: a run
on such data "succeeds" and learns nothing. Two things make an example unusable:

- its prompt is empty, or too long to be followed by `max_new_tokens` generated tokens within the
  model's length (the engine's admission rule: prompt + max_tokens ≤ max_position_embeddings);
- its answer is longer than `max_new_tokens`, so no completion can ever match it.

Lengths are counted in tokens of the task's own tokenizer, whatever it is (a checkpoint's, with
`--model`), a prompt as the model is sent it: after the checkpoint's chat template where one applies.
"""

from dataclasses import dataclass

from . import Example, Task

NUM_LINES_SHOWN = 5


class DataError(ValueError):
    """Data the run cannot use: the message names how many examples, why, and their lines."""


@dataclass(frozen=True)
class Unusable:
    """The examples of one kind of problem, and that problem in words (with its limit)."""

    problem: str
    examples: tuple[Example, ...]

    def describe(self) -> str:
        count = len(self.examples)
        lines = [str(e.line) for e in self.examples[:NUM_LINES_SHOWN]]
        more = f" … {count - NUM_LINES_SHOWN} more" if count > NUM_LINES_SHOWN else ""
        return f"{count} with {self.problem} (line{'s' if count > 1 else ''} {', '.join(lines)}{more})"


def find_unusable(task: Task, *, max_length: int, max_new_tokens: int) -> list[Unusable]:
    """The examples of `task.examples` a run cannot use, grouped by problem (empty kinds left out).

    `max_length` is the model's length in tokens (prompt and generated tokens together)."""
    max_prompt = max_length - max_new_tokens
    kinds = {
        f"a prompt of more than {max_prompt} tokens = the model's length {max_length} - max_new_tokens {max_new_tokens}": [],
        f"an answer of more than max_new_tokens = {max_new_tokens} tokens": [],
        "an empty prompt": [],
    }
    long_prompt, long_answer, empty = kinds.values()
    tokenizer = task.tokenizer
    for example in task.examples:
        prompt = len(tokenizer.encode_prompt(example.prompt))
        if prompt == 0:
            empty.append(example)
        elif prompt > max_prompt:
            long_prompt.append(example)
        elif len(tokenizer.encode(example.answer)) > max_new_tokens:
            long_answer.append(example)
    return [Unusable(problem, tuple(found)) for problem, found in kinds.items() if found]


def usable_task(task: Task, *, max_length: int, max_new_tokens: int, skip: bool) -> tuple[Task, str | None]:
    """(the task, None) when every example fits the run; with `skip`, (the task without the others,
    a one-line note of what was dropped). Raises DataError otherwise, or when nothing would be left."""
    if not task.examples:
        _check_generated(task, max_length=max_length, max_new_tokens=max_new_tokens)
        return task, None
    unusable = find_unusable(task, max_length=max_length, max_new_tokens=max_new_tokens)
    if not unusable:
        return task, None
    dropped = {id(e) for kind in unusable for e in kind.examples}
    kept = [e for e in task.examples if id(e) not in dropped]
    what = "; ".join(kind.describe() for kind in unusable)
    source, total = task.name.removeprefix("jsonl:"), len(task.examples)
    if not kept:
        raise DataError(f"none of the {total} examples of {source} can be trained on: {what}")
    if not skip:
        raise DataError(f"{len(dropped)} of the {total} examples of {source} cannot be trained on: {what} "
                        "(--skip-bad-examples drops them)")
    return task.keeping(kept), f"dropped {len(dropped)} of the {total} examples of {source}: {what}"


def _check_generated(task: Task, *, max_length: int, max_new_tokens: int) -> None:
    """An embedded task's prompts against the model's length (over a checkpoint's tokenizer and chat
    template they can outgrow a small model) and its answers against max_new_tokens; there is no line
    of data to drop, so either is an error."""
    longest = max((len(task.tokenizer.encode_prompt(p)) for p in task.prompts), default=0)
    if longest > max_length - max_new_tokens:
        raise DataError(f"task {task.name}: its prompts take up to {longest} tokens, more than {max_length - max_new_tokens} "
                        f"= the model's length {max_length} - max_new_tokens {max_new_tokens}")
    unreachable = [a for a in task.answers if len(task.tokenizer.encode(a)) > max_new_tokens]
    if unreachable:
        longest = max(len(task.tokenizer.encode(a)) for a in unreachable)
        raise DataError(f"task {task.name}: {len(unreachable)} of its {len(task.answers)} answers take more than max_new_tokens = "
                        f"{max_new_tokens} tokens (up to {longest}), so no completion could match them")
