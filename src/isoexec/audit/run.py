"""`isoexec audit`: roll out a mixed workload in the engine, score it in the trainer under another
packing, and compare every sampled token's log-probability and every full-vocabulary row, and for an
MoE model the experts each sampled token's row was routed to."""

import contextlib
import time

from ..contract.identity import identities
from ..contract.schema import Contract
from ..engine import LLMEngine
from ..model import Decoder, tracing
from ..trainer import Trainer
from .metrics import compare, compare_routing
from .workload import engine_config, prompts_and_params


class AuditError(ValueError):
    """A workload the audit cannot compare anything on."""


def run_audit(model: Decoder, contract: Contract, *, requests: int = 16, max_new_tokens: int = 16, seed: int = 0,
              device: str = "cpu", progress: bool = True, tracer=None, prompts: list[list[int]] | None = None) -> dict:
    """prompts: token ids (a file's, `workload.file_prompts`) the requests cycle through; None: random ones."""
    start = time.perf_counter()
    prompts, params = prompts_and_params(model.spec, requests, max_new_tokens, seed, prompts)
    config = engine_config(contract, prompts, max_new_tokens)
    engine = LLMEngine(model, contract, config, device=device)
    with tracing(tracer) if tracer is not None else contextlib.nullcontext():
        completions = engine.generate(prompts, params, progress=progress)
    failed = [c for c in completions if c.finish_reason == "error"]
    done = [c for c in completions if c.finish_reason != "error"]
    if not done:
        raise AuditError(f"the engine refused all {len(failed)} requests, so nothing was compared; request 0: {failed[0].error}")
    sequences = [c.prompt + c.token_ids for c in done]
    # The trainer packs its own way: micro-batches of about a third of the workload, longest first.
    budget = max(len(s) for s in sequences) + sum(len(s) for s in sequences) // 3
    report = {"model": model.spec.architecture, "contract": {"name": contract.name, **identities(contract).to_dict()}}
    rollout = [c.logprobs for c in done], [c.full_logprobs for c in done], [c.token_ids for c in done]
    trainer = Trainer(model, contract)
    for case in ("trainer_score", "trainer_fwd"):
        labels = [c.request_id for c in done] if tracer is not None and case == "trainer_score" else None
        with tracing(tracer) if labels is not None else contextlib.nullcontext():
            rows, routing = trainer.logprobs(sequences, case=case, micro_batch_tokens=budget, device=device, labels=labels, routing=True)
        generated = [r[len(c.prompt) - 1 :] for r, c in zip(rows, done)]
        # The routing of the rows the tokens were drawn from: positions len(prompt) - 1 … len(sequence) - 2.
        generated_routing = [None if r is None else r[len(c.prompt) - 1 : -1] for r, c in zip(routing, done)]
        report[case] = compare(rollout[0], rollout[1], generated, rollout[2]) | compare_routing([c.routing for c in done], generated_routing)
    report.update({
        **{k: report["trainer_score"][k] for k in ("tokens", "bitwise_equal_tokens", "full_vocab_rows", "full_vocab_rows_bitwise_equal",
                                                   "rollout_train_logprob_abs_diff_mean", "rollout_train_logprob_abs_diff_max", "k3_kl",
                                                   "routing_compared_tokens", "routing_mismatch_tokens")},
        "requests": requests,
        "prompt_token_ids": [c.prompt for c in completions],
        "failed_requests": [{"request": c.request_id, "error": c.error} for c in failed],
        "engine": dict(engine.stats) | {"num_pages": config.num_pages, "prefill_chunk_size": config.prefill_chunk_size},
        "device": str(device),
        "seconds": round(time.perf_counter() - start, 2),
    })
    first = report["trainer_score"]["first_mismatch"]
    if tracer is not None and first is not None:
        completion = done[first["request"]]
        report["trace"] = tracer.explain(completion.request_id, len(completion.prompt) - 1 + first["token"], contract)
    return report


def all_equal(report: dict) -> bool:
    return all(report[case]["bitwise_equal_tokens"] == report[case]["tokens"] and
               report[case]["full_vocab_rows_bitwise_equal"] == report[case]["full_vocab_rows"] and
               not report[case]["routing_mismatch_tokens"] for case in ("trainer_score", "trainer_fwd"))


def render(report: dict) -> str:
    ids = report["contract"]
    engine = report["engine"]
    lines = [
        f"audit: {report['model']} under contract {ids['name']} (numerical_policy {ids['numerical_policy'][:23]}…), "
        f"{report['requests']} requests on {report['device']}, {report['seconds']} s",
        f"  engine: {engine.get('decode_tokens', 0)} decode tokens, {engine.get('prefill_chunks', 0)} prefill chunks of ≤{engine['prefill_chunk_size']}, "
        f"{engine.get('preemptions', 0)} preemptions, {engine.get('prefix_cache_hit_tokens', 0)} prefix-cache hit tokens, {engine['num_pages']} pages",
        f"  {'trainer case':<14} {'tokens equal':>14} {'full rows equal':>16} {'|Δlogp| mean':>13} {'|Δlogp| max':>12} {'k3 KL':>10}",
    ]
    for case in ("trainer_score", "trainer_fwd"):
        r = report[case]
        lines.append(f"  {case:<14} {r['bitwise_equal_tokens']:>6}/{r['tokens']:<7} {r['full_vocab_rows_bitwise_equal']:>7}/{r['full_vocab_rows']:<8} "
                     f"{r['rollout_train_logprob_abs_diff_mean']:>13.3g} {r['rollout_train_logprob_abs_diff_max']:>12.3g} {r['k3_kl']:>10.3g}")
    score, fwd = report["trainer_score"], report["trainer_fwd"]
    if score["routing_compared_tokens"] is not None:
        lines.append(f"  routing: {score['routing_mismatch_tokens']}/{score['routing_compared_tokens']} tokens with a different expert set "
                     f"in some MoE layer (trainer_score), {fwd['routing_mismatch_tokens']}/{fwd['routing_compared_tokens']} (trainer_fwd)")
    for failure in report["failed_requests"]:
        lines.append(f"  request {failure['request']} failed: {failure['error']}")
    if all_equal(report):
        lines.append("every sampled token and every full-vocabulary row is bitwise equal between rollout and trainer")
    else:
        first = score["first_mismatch"]
        rows_differ = any(r["full_vocab_rows_bitwise_equal"] != r["full_vocab_rows"] for r in (score, fwd))
        lines.append(f"MISMATCH: first at request {first['request']}, generated token {first['token']}" if first
                     else f"MISMATCH in {'full-vocabulary rows' if rows_differ else 'routing'}")
        if "trace" in report:
            lines.append("  trace: " + report["trace"]["summary"])
    return "\n".join(lines)
