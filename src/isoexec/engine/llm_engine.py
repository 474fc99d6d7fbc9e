"""The rollout engine: `generate → step → schedule → run → postprocess`.

Every token's row is computed by contract ops whose bits depend only on the row's own tokens and
absolute position, so batch composition, chunking, prefix-cache hits, preemption and padded CUDA-graph
decode steps change the work done, never the bits (under a bitwise contract; under `native` they
visibly do).
"""

import dataclasses
import logging
import operator

import torch
from tqdm.auto import tqdm

from ..contract.schema import Contract
from ..model.spec import RecurrentState
from ..parallel import Mesh
from .config import EngineConfig, SamplingParams
from .model_runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Completion, Sequence

log = logging.getLogger(__name__)

STATS = ("steps", "prefill_chunks", "prefill_tokens", "decode_tokens", "preemptions", "prefix_cache_hit_tokens")


class LLMEngine:
    """With a `mesh` of more than one rank, `model` is this rank's shard (`parallel.shard`): every rank runs the
    same steps on its shard, and every rank's completions are the same."""

    def __init__(self, model, contract: Contract, config: EngineConfig, device: str = "cpu", mesh=None):
        config.check(contract)
        held_on = next(model.parameters()).device
        if held_on.type != torch.device(device).type:
            raise ValueError(f"the model's weights are on {held_on} but the engine runs on {device}: move the model first")
        if config.prefix_caching and any(isinstance(layer.state(), RecurrentState) for layer in model.spec.layers):
            log.warning("prefix caching is off for %s: the state its Gated DeltaNet layers hold after a prefix is not kept per page "
                        "(docs/gdn.md)", model.spec.architecture)
            config = dataclasses.replace(config, prefix_caching=False)
        self.model, self.contract, self.config = model, contract, config
        self.mesh = mesh if mesh is not None else Mesh()  # its sizes go into the engine's fingerprint
        self.runner = ModelRunner(model, contract, config, device, mesh)
        self.binding = self.runner.binding  # what this engine calls: its fingerprint is taken from it
        self.stats = dict.fromkeys(STATS, 0)  # counters over the engine's lifetime
        self.scheduler = Scheduler(config, self.stats)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 progress: bool = True) -> list[Completion]:
        """One completion per prompt, in prompt order; a bad request gets an "error" completion only."""
        params = _per_prompt(params, len(prompts))
        # A fresh scheduler and a poisoned cache: prefixes cached under earlier weights are never reused.
        self.scheduler = Scheduler(self.config, self.stats)
        self.runner.reset()
        done = {}
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            tokens, error = self._admissible(prompt, p)
            if error:
                done[i] = Completion.failed(i, prompt, error)
            else:
                self.scheduler.add(Sequence(i, tokens, p, i if p.seed is None else p.seed, self.model.spec.eos_token_id))
        with tqdm(total=len(prompts), initial=len(done), disable=not progress, desc="generate", unit="req") as bar:
            while not self.scheduler.is_finished():
                for seq in self.step():
                    done[seq.request_id] = seq.completion()
                    bar.update()
        return [done[i] for i in range(len(prompts))]

    def step(self) -> list[Sequence]:
        """Schedule, run the prefill chunks and the decodes as two forwards (one case each), advance.
        -> the sequences that finished."""
        prefills, decodes = self.scheduler.schedule()
        if not prefills and not decodes:
            raise RuntimeError("scheduler made no progress (engine bug): nothing running could be scheduled")
        cases = (("engine_prefill", prefills), ("engine_decode", decodes))
        results = [(seqs, self.runner.run(seqs, case)) for case, seqs in cases if seqs]
        self.stats["steps"] += 1
        self.stats["prefill_chunks"] += len(prefills)
        self.stats["prefill_tokens"] += sum(seq.num_scheduled for seq in prefills)
        self.stats["decode_tokens"] += len(decodes)
        return [seq for seqs, out in results for seq in self.scheduler.postprocess(seqs, *out)]

    def _admissible(self, prompt, params: SamplingParams) -> tuple[list[int], str | None]:
        """(token ids, None), or (_, why this request cannot run)."""
        spec, config = self.model.spec, self.config
        try:
            tokens = [operator.index(t) for t in prompt]
        except TypeError:
            return [], f"prompt must be a sequence of int token ids, got {type(prompt).__name__}"
        if not tokens:
            return tokens, "empty prompt: there is no position to compute the first token's row from"
        bad = next((i for i, t in enumerate(tokens) if not 0 <= t < spec.vocab_size), None)
        if bad is not None:
            return tokens, f"prompt token {tokens[bad]} at index {bad} is outside the vocabulary [0, {spec.vocab_size})"
        if len(tokens) + params.max_tokens > spec.max_position_embeddings:
            return tokens, (f"prompt of {len(tokens)} tokens + max_tokens {params.max_tokens} exceeds "
                            f"max_position_embeddings {spec.max_position_embeddings}")
        if config.max_model_len is not None and len(tokens) + params.max_tokens > config.max_model_len:
            return tokens, (f"prompt of {len(tokens)} tokens + max_tokens {params.max_tokens} exceeds "
                            f"the engine's max_model_len {config.max_model_len}")
        # The last drawn token's keys are never computed, hence the - 1.
        pages = -(-(len(tokens) + params.max_tokens - 1) // config.kv_page_size)
        if pages > config.num_pages:
            return tokens, (f"prompt of {len(tokens)} tokens + max_tokens {params.max_tokens} needs up to {pages} KV pages "
                            f"of {config.kv_page_size} tokens; the whole cache has {config.num_pages}")
        return tokens, None


def _per_prompt(params, num_prompts: int) -> list[SamplingParams]:
    params = [params] * num_prompts if isinstance(params, SamplingParams) else list(params)
    if len(params) != num_prompts:
        raise ValueError(f"generate: {num_prompts} prompts but {len(params)} SamplingParams")
    if not all(isinstance(p, SamplingParams) for p in params):
        raise TypeError("generate: params must be a SamplingParams or a list of them, one per prompt")
    return params
