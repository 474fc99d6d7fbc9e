"""The on-policy gate: the trainer's recomputed log-probs against the rollout's, every step.

Under a bitwise contract any token (or full-vocabulary row) whose bits differ stops the step with a
report naming the request and position, and — when tracing — the first diverging region. Under a
contract that claims nothing (native) the mismatch is measured and returned as metrics.
"""

from ..audit.metrics import compare


class GateError(RuntimeError):
    """A trainer log-prob differs from the rollout's under a bitwise contract."""

    def __init__(self, report: dict):
        super().__init__(report["summary"])
        self.report = report

    def __reduce__(self):  # rebuilt from its report when it crosses a process boundary (Ray mode)
        return (GateError, (self.report,))


def gate(run, kept, generated) -> dict:
    """kept: the completions trained on; generated: the trainer's [n, V] rows for their tokens."""
    m = compare([c.logprobs for c in kept], [c.full_logprobs for c in kept], [g.detach() for g in generated], [c.token_ids for c in kept])
    metrics = {
        "tokens": m["tokens"],
        "bitwise_equal_fraction": m["bitwise_equal_tokens"] / max(m["tokens"], 1),
        "rollout_train_logprob_abs_diff_mean": m["rollout_train_logprob_abs_diff_mean"],
        "rollout_train_logprob_abs_diff_max": m["rollout_train_logprob_abs_diff_max"],
        "k3_kl": m["k3_kl"],
    }
    if run.config.gate_full_rows:  # else the engine returned no rows to hold the trainer's against
        metrics["full_vocab_rows_bitwise_equal_fraction"] = m["full_vocab_rows_bitwise_equal"] / max(m["full_vocab_rows"], 1)
    mismatch = m["bitwise_equal_tokens"] != m["tokens"] or m["full_vocab_rows_bitwise_equal"] != m["full_vocab_rows"]
    if mismatch and run.contract.claims.is_bitwise:
        first = m["first_mismatch"] or {"request": 0, "token": 0}
        completion = kept[first["request"]]
        position = len(completion.prompt) - 1 + first["token"]
        report = {"step": run.step, "request": completion.request_id, "position": position, **metrics}
        where = f"request {completion.request_id}, position {position}"
        if run.config.trace:
            report["trace"] = run.trace(completion.request_id, position)
            where += f"; {report['trace']['summary']}"
        report["summary"] = (f"gate: step {run.step}: {m['tokens'] - m['bitwise_equal_tokens']} of {m['tokens']} trainer log-probs differ "
                             f"from the rollout's under contract {run.contract.name} (first at {where})")
        raise GateError(report)
    return metrics
