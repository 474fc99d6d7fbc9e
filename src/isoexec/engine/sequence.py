"""One request as the engine tracks it, and what `generate` hands back for it."""

import enum
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import SamplingParams


PENDING = -1  # token_ids' entry for a token drawn by a step whose outputs have not reached the host yet


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Completion:
    request_id: int
    prompt: list[int]
    token_ids: list[int]
    logprobs: Tensor  # [n] float32: the sampled tokens' log-probs, bits as computed
    full_logprobs: Tensor | None  # [n, V] float32, the rows the tokens were sampled from
    finish_reason: str  # "stop" | "length" | "error"
    error: str | None = None
    routing: Tensor | None = None  # [n, layers, k] int64 expert ids of each token's row, -1 where none (EngineConfig.record_routing)

    @classmethod
    def failed(cls, request_id: int, prompt, error: str) -> "Completion":
        prompt = list(prompt) if isinstance(prompt, (list, tuple)) else []
        return cls(request_id, prompt, [], torch.empty(0, dtype=torch.float32), None, "error", error)


class Sequence:
    """Prompt + generated tokens, the pages holding their keys, and how far those keys are computed.

    Invariant between steps: keys of positions [0, num_computed) are in the cache. Admission sets
    prefill_end = len(self): forwards up to there are prefill chunks, the last one drawing a token;
    from then on each forward decodes the last token. Preemption resets num_computed (to the
    prefix-cache hit on re-admission) and so re-prefills prompt + generated tokens, never losing one.
    """

    def __init__(self, request_id: int, prompt: list[int], params: SamplingParams, seed: int, eos_token_id: int | None):
        self.request_id, self.params, self.seed = request_id, params, seed
        self.prompt = list(prompt)
        self.token_ids = list(prompt)
        self.stop_ids = set(params.stop_token_ids) | ({eos_token_id} if eos_token_id is not None and not params.ignore_eos else set())
        self.status = Status.WAITING
        self.num_computed = 0
        self.num_scheduled = 0  # tokens this step's forward computes for the sequence
        self.prefill_end = 0
        self.state_slot: int | None = None  # the sequence slot of per-sequence layer state while running (Scheduler)
        self.page_table: list[int] = []  # page id of positions [i * page_size, (i + 1) * page_size)
        self.page_hashes: list[bytes] = []  # chain hash of each full page whose keys are computed
        self.logprobs: list[Tensor] = []  # [1] float32 each
        self.rows: list[Tensor] = []  # [V] float32 each, kept only when asked for
        self.routing: list[Tensor] = []  # [layers, k] int64 each, kept when the engine records routing
        self.finish_reason: str | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - len(self.prompt)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.prefill_end

    @property
    def samples_this_step(self) -> bool:
        """This step's forward reaches the last token, so its row draws the next token."""
        return self.num_computed + self.num_scheduled == len(self)

    @property
    def drew_last(self) -> bool:
        """Every token up to max_tokens is drawn, or reserved by a step still in flight: nothing more to schedule."""
        return self.num_generated >= self.params.max_tokens

    def reserve(self) -> int:
        """Hold the place of the token the step just launched draws for this sequence -> its index in
        token_ids. Until `settle` fills it in, only the device knows the token (the engine's async scheduling)."""
        self.token_ids.append(PENDING)
        return len(self.token_ids) - 1

    def settle(self, index: int, token: int, logprob: Tensor, row: Tensor, routing: Tensor | None = None) -> None:
        """Record the token drawn at `index` (with the experts of the row it was drawn from, when recorded);
        finish on a stop token (kept in the output) or at max_tokens, dropping any place reserved after it."""
        self.token_ids[index] = token
        self.logprobs.append(logprob)
        if routing is not None:
            self.routing.append(routing)
        if self.params.return_full_logprobs:
            self.rows.append(row.clone())  # a copy, so the step's whole [R, V] block can be freed
        if token in self.stop_ids:
            self.finish_reason = "stop"
        elif index + 1 - len(self.prompt) >= self.params.max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            del self.token_ids[index + 1 :]

    def completion(self) -> Completion:
        logprobs = torch.cat(self.logprobs) if self.logprobs else torch.empty(0, dtype=torch.float32)
        rows = torch.stack(self.rows).cpu() if self.params.return_full_logprobs and self.rows else None
        routing = torch.stack(self.routing) if self.routing else None
        return Completion(self.request_id, self.prompt, self.token_ids[len(self.prompt):], logprobs, rows, self.finish_reason, routing=routing)
