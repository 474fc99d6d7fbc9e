"""`isoexec audit`: roll out a mixed workload in the engine, score it in the trainer under another
packing, and compare every sampled token's log-probability and every full-vocabulary row, and for an
MoE model the experts each sampled token's row was routed to. Each side may run tensor-parallel at its
own size (`trainer_tp`, `engine_tp`): it then runs in processes of its own (`parallel.spawn`), each rank on
its shard, and the comparison is between the two sides' rank 0 results. On a GPU the ranks share it, their
collectives on gloo through host memory, and a parallel engine runs without CUDA graphs."""

import contextlib
import copy
import dataclasses
import time

import torch.distributed as dist

from ..contract.identity import identities
from ..contract.schema import Contract
from ..engine import LLMEngine
from ..model import Decoder, tracing
from ..parallel import backend_for, check, shard, spawn, world_of
from ..trainer import Trainer
from .metrics import compare, compare_routing
from .workload import engine_config, prompts_and_params


class AuditError(ValueError):
    """A workload the audit cannot compare anything on."""


# The rollout engines: IsoExec's own; vLLM serving IsoExec's model through the plugin (isoexec.vllm); vLLM's own
# model and sampler, what a user without IsoExec rolls out with (the control).
ENGINES = ("isoexec", "vllm", "vllm-own")


def _rank_model(model: Decoder, contract: Contract, mesh) -> Decoder:
    return shard(model, contract, mesh) if mesh.world > 1 else model


def _roll_out(mesh, model, contract, config, prompts, params, device, progress, tracer):
    """One engine rank: its completions and the engine's counters (summed over the replicas)."""
    engine = LLMEngine(_rank_model(model, contract, mesh).to(device), contract, config, device=device, mesh=mesh)
    with tracing(tracer) if tracer is not None else contextlib.nullcontext():
        completions = engine.generate(prompts, params, progress=progress and mesh.rank == 0 and mesh.dp_rank == 0)
    stats = dict(engine.stats)
    if mesh.dp > 1:
        shares = [None] * mesh.dp
        dist.all_gather_object(shares, stats, group=mesh.dp_mesh.get_group())
        stats = {name: sum(share[name] for share in shares) for name in stats}
    return completions, stats, mesh.sizes()


def _score(mesh, model, contract, sequences, budget, device, labels, tracer):
    """One trainer rank: each trainer case's rows and routing for `sequences`."""
    trainer = Trainer(_rank_model(model, contract, mesh).to(device), contract, mesh)
    out = {}
    for case in ("trainer_score", "trainer_fwd"):
        case_labels = labels if tracer is not None and case == "trainer_score" else None
        with tracing(tracer) if case_labels is not None else contextlib.nullcontext():
            rows, routing = trainer.logprobs(sequences, case=case, micro_batch_tokens=budget, device=device, labels=case_labels, routing=True)
        out[case] = [r.detach() for r in rows], routing
    return out, mesh.sizes()


DP_ON_GPU = ("a data-parallel trainer on the GPU runs over NCCL, a GPU a rank (ISOEXEC_DIST_BACKEND=nccl); FSDP over gloo "
             "with ranks sharing a GPU is not built")


def run_audit(model: Decoder, contract: Contract, *, requests: int = 16, max_new_tokens: int = 16, seed: int = 0,
              device: str = "cpu", progress: bool = True, tracer=None, prompts: list[list[int]] | None = None, trainer_tp: int = 1,
              engine_tp: int = 1, trainer_ep: int = 1, engine_ep: int = 1, trainer_sp: bool = False, engine_sp: bool = False,
              trainer_dp: int = 1, engine_dp: int = 1, engine: str = "isoexec") -> dict:
    """prompts: token ids (a file's, `workload.file_prompts`) the requests cycle through; None: random ones.
    trainer_tp / engine_tp, trainer_ep / engine_ep, trainer_sp / engine_sp: each side's tensor- and
    expert-parallel sizes and sequence parallelism (processes on this machine, gloo); trainer_dp: the trainer's
    data-parallel groups (FSDP), each scoring its share of the sequences; engine_dp: the engine's replicas, each
    generating its share of the requests (in lockstep where EP spans them). The report's `layout` is each side's
    sizes as its rank 0 ran them. engine: `ENGINES`' names; the vLLM ones run in this process, unsharded."""
    start = time.perf_counter()
    for tp, ep, sp, dp in ((trainer_tp, trainer_ep, trainer_sp, trainer_dp), (engine_tp, engine_ep, engine_sp, engine_dp)):
        check(model.spec, contract, tp, ep, sp, dp)
    if trainer_dp > requests:
        raise ValueError(f"trainer DP = {trainer_dp} needs at least {trainer_dp} requests (one sequence a group), got {requests}")
    backends = [backend_for(device, ranks) for ranks in (world_of(trainer_tp, trainer_ep, trainer_dp) * trainer_dp,
                                                          world_of(engine_tp, engine_ep, engine_dp) * engine_dp)]  # before either side runs
    if max(trainer_tp, engine_tp, trainer_ep, engine_ep, trainer_dp, engine_dp) > 1 and tracer is not None:
        raise ValueError("a parallel audit runs without --trace")
    if trainer_dp > 1 and str(device) != "cpu" and backends[0] != "nccl":
        raise ValueError(DP_ON_GPU)
    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")
    if engine != "isoexec" and (max(engine_tp, engine_ep, engine_dp) > 1 or engine_sp or tracer is not None):
        raise ValueError(f"the {engine} engine runs unsharded and untraced so far")
    prompts, params = prompts_and_params(model.spec, requests, max_new_tokens, seed, prompts)
    config = engine_config(contract, prompts, max_new_tokens)
    # Parallel ranks get the weights on the host and move their shards to `device` (all ranks may share one GPU).
    one_process = max(trainer_tp, engine_tp, trainer_ep, engine_ep, trainer_dp, engine_dp) == 1
    host = model if str(device) == "cpu" or one_process else copy.deepcopy(model).cpu()
    engine_parallel = max(engine_tp, engine_ep, engine_dp) > 1
    if engine_parallel and config.cuda_graphs:
        config = dataclasses.replace(config, cuda_graphs=False)  # not built yet with gloo's collectives: said in the report
    if engine == "isoexec":
        completions, stats, engine_layout = spawn(engine_tp, _roll_out, host if engine_parallel else model, contract, config, prompts, params,
                                                  device, progress, tracer, ep=engine_ep, sp=engine_sp, dp=engine_dp, device=device)
    else:
        from ..vllm.rollout import roll_out

        completions, stats, engine_layout = roll_out(model, contract, config, prompts, params, plugin=engine == "vllm", device=device,
                                                     progress=progress)
    failed = [c for c in completions if c.finish_reason == "error"]
    done = [c for c in completions if c.finish_reason != "error"]
    if not done:
        raise AuditError(f"the engine refused all {len(failed)} requests, so nothing was compared; request 0: {failed[0].error}")
    sequences = [c.prompt + c.token_ids for c in done]
    # The trainer packs its own way: micro-batches of about a third of the workload, longest first.
    budget = max(len(s) for s in sequences) + sum(len(s) for s in sequences) // 3
    report = {"model": model.spec.architecture, "contract": {"name": contract.name, **identities(contract).to_dict()}}
    rollout = [c.logprobs for c in done], [c.full_logprobs for c in done], [c.token_ids for c in done]
    trainer_parallel = max(trainer_tp, trainer_ep, trainer_dp) > 1
    scored, trainer_layout = spawn(trainer_tp, _score, host if trainer_parallel else model, contract, sequences, budget, device,
                                   [c.request_id for c in done], tracer, ep=trainer_ep, sp=trainer_sp, dp=trainer_dp, device=device)
    for case, (rows, routing) in scored.items():
        generated = [r[len(c.prompt) - 1 :] for r, c in zip(rows, done)]
        # The routing of the rows the tokens were drawn from: positions len(prompt) - 1 … len(sequence) - 2.
        generated_routing = [None if r is None else r[len(c.prompt) - 1 : -1] for r, c in zip(routing, done)]
        if any(c.routing is None for c in done):  # vLLM's engines report no routing: the tokens and rows are compared
            generated_routing = [None] * len(done)
        report[case] = compare(rollout[0], rollout[1], generated, rollout[2]) | compare_routing([c.routing for c in done], generated_routing)
    report.update({
        **{k: report["trainer_score"][k] for k in ("tokens", "bitwise_equal_tokens", "full_vocab_rows", "full_vocab_rows_bitwise_equal",
                                                   "rollout_train_logprob_abs_diff_mean", "rollout_train_logprob_abs_diff_max", "k3_kl",
                                                   "routing_compared_tokens", "routing_mismatch_tokens")},
        "requests": requests,
        "layout": {"trainer": trainer_layout, "engine": engine_layout},
        "prompt_token_ids": [c.prompt for c in completions],
        "failed_requests": [{"request": c.request_id, "error": c.error} for c in failed],
        "engine": stats | {"num_pages": config.num_pages, "prefill_chunk_size": config.prefill_chunk_size, "cuda_graphs": config.cuda_graphs},
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
        f"{report['requests']} requests on {report['device']}, {report['seconds']} s"
        + "".join(f"; {side} TP {sizes['tp']}, EP {sizes['ep']}{', SP' if sizes['sp'] else ''}{', DP %d' % sizes['dp'] if sizes['dp'] > 1 else ''}"
                  for side, sizes in report.get("layout", {}).items() if max(sizes["tp"], sizes["ep"], sizes["dp"]) > 1),
        f"  engine: {engine['engine'] + ', ' if 'engine' in engine else ''}{engine.get('decode_tokens', 0)} decode tokens, "
        + (f"{engine['prefill_chunks']} prefill chunks of ≤{engine['prefill_chunk_size']}, " if "prefill_chunks" in engine
           else f"prefill chunks of ≤{engine['prefill_chunk_size']}, ")
        + f"{engine.get('preemptions', 0)} preemptions, {engine.get('prefix_cache_hit_tokens', 0)} prefix-cache hit tokens, {engine['num_pages']} pages"
        + (f", {engine['idle_forwards']} padding forwards (replicas in lockstep)" if engine.get("idle_forwards") else "")
        + (f", CUDA graphs {'on' if engine.get('cuda_graphs') else 'off'}" if report["device"] != "cpu" else ""),
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
