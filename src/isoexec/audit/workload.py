"""The audit's rollout workload: varied prompt lengths, shared prefixes, mixed sampling, and an engine
configuration small enough to force chunked prefill and preemption. The prompts are random tokens, or
a JSONL file's prompts encoded with the checkpoint's tokenizer (`file_prompts`)."""

import math
from pathlib import Path

import torch

from ..contract.schema import Contract
from ..engine import EngineConfig, SamplingParams
from ..model import ModelSpec

# Prompt lengths straddling the attention block (16) and page boundaries.
LENGTHS = (1, 5, 15, 16, 17, 31, 33, 47, 64, 70, 3, 90)
SHARED_PREFIX = 48


def prompts_and_params(spec: ModelSpec, requests: int, max_new_tokens: int, seed: int,
                       prompts: list[list[int]] | None = None) -> tuple[list[list[int]], list[SamplingParams]]:
    """`requests` prompts and their sampling: random ones, or cycling through `prompts` when given."""
    if prompts is None:
        prompts = random_prompts(spec, requests, max_new_tokens, seed)
    else:
        prompts = [list(prompts[i % len(prompts)]) for i in range(requests)]
    params = []
    for i in range(requests):
        kind = i % 3
        params.append(SamplingParams(
            temperature=(0.0, 1.0, 0.8)[kind], top_k=(0, 0, 40)[kind], top_p=(1.0, 1.0, 0.9)[kind],
            max_tokens=max_new_tokens, seed=seed * 100_003 + i, ignore_eos=True, return_full_logprobs=True,
        ))
    return prompts, params


def random_prompts(spec: ModelSpec, requests: int, max_new_tokens: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    longest = max(1, spec.max_position_embeddings - max_new_tokens)
    prefix = torch.randint(spec.vocab_size, (SHARED_PREFIX,), generator=generator).tolist()
    prompts = []
    for i in range(requests):
        length = min(LENGTHS[i % len(LENGTHS)] + 7 * (i // len(LENGTHS)), longest)
        tail = torch.randint(spec.vocab_size, (length,), generator=generator).tolist()
        prompts.append((prefix + tail)[:longest] if i % 2 else tail)  # every other request shares a prefix
    return prompts


def file_prompts(path, tokenizer, *, max_length: int, max_new_tokens: int) -> list[list[int]]:
    """The prompts of a JSONL file of {"prompt": ...} objects (an "answer" is ignored), encoded with
    `tokenizer.encode_prompt`. ValueError, starting with the path, for a file that cannot be read and
    for prompts that cannot run (empty, or too long for `max_length` with `max_new_tokens` after them),
    naming their lines."""
    from ..rl.tasks import Example, read_jsonl
    from ..rl.tasks.checks import Unusable

    prompts = [Example(str(record["prompt"]), "", line) for line, record in read_jsonl(Path(path), ("prompt",), what="prompts")]
    encoded = [tokenizer.encode_prompt(p.prompt) for p in prompts]
    max_prompt = max_length - max_new_tokens
    kinds = {
        f"a prompt of more than {max_prompt} tokens = the model's length {max_length} - max_new_tokens {max_new_tokens}":
            [p for p, ids in zip(prompts, encoded) if len(ids) > max_prompt],
        "an empty prompt": [p for p, ids in zip(prompts, encoded) if not ids],
    }
    unusable = [Unusable(problem, tuple(found)) for problem, found in kinds.items() if found]
    if unusable:
        count = sum(len(kind.examples) for kind in unusable)
        raise ValueError(f"{path}: {count} of the {len(prompts)} prompts cannot run: {'; '.join(kind.describe() for kind in unusable)}")
    return encoded


# Prefill chunk size of the audit's engine: long prompts are chunked, and since 37 is no multiple of a
# key block or a page, chunks start inside blocks and pages.
PREFILL_CHUNK = 37


def engine_config(contract: Contract, prompts: list[list[int]], max_new_tokens: int) -> EngineConfig:
    """Pages for about half the workload at once (so sequences get preempted), prefill chunks that start
    anywhere (`PREFILL_CHUNK`), and each sampled token's routing recorded (an MoE model's)."""
    page = contract.deployment.engine.kv_page_size
    pages = [math.ceil((len(p) + max_new_tokens) / page) for p in prompts]
    return EngineConfig.from_contract(contract, num_pages=max(max(pages) + 1, sum(pages) // 2), prefill_chunk_size=PREFILL_CHUNK,
                                      record_routing=True)
