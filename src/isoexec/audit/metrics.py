"""Rollout vs trainer comparison, with the metric names the RL frameworks use."""

import torch
from torch import Tensor


def _int_bits(t: Tensor) -> Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t.contiguous().view(torch.int64)


def compare(rollout_logprobs: list[Tensor], rollout_rows: list[Tensor | None], trainer_rows: list[Tensor], tokens: list[list[int]]) -> dict:
    """Per completion: the rollout's sampled-token log-probs [n] and full rows [n, V] against the
    trainer's rows [n, V] for the same positions. r = logp_train - logp_rollout; k3 = mean(eʳ - r - 1)."""
    sampled_equal = rows = rows_equal = 0
    diffs, k3 = [], []
    first = None
    for i, (lp, full, trained, ids) in enumerate(zip(rollout_logprobs, rollout_rows, trainer_rows, tokens)):
        if not ids:
            continue
        # The sampled tokens' log-probs are picked where the trainer's rows are (a GPU: only they cross to the host).
        trained = trained.detach()
        lp = lp.cpu()
        train_lp = trained.gather(-1, torch.tensor(ids, device=trained.device).unsqueeze(-1)).squeeze(-1).cpu()  # [n]
        same = _int_bits(train_lp) == _int_bits(lp)
        sampled_equal += int(same.sum())
        if first is None and not bool(same.all()):
            first = {"request": i, "token": int((~same).nonzero()[0])}
        r = train_lp.double() - lp.double()
        diffs.append(r.abs())
        k3.append(torch.expm1(r) - r)
        if full is not None:
            rows += full.shape[0]
            rows_equal += int((_int_bits(full.cpu()) == _int_bits(trained.cpu())).all(-1).sum())
    diffs = torch.cat(diffs) if diffs else torch.zeros(0, dtype=torch.float64)
    k3 = torch.cat(k3) if k3 else torch.zeros(0, dtype=torch.float64)
    return {
        "tokens": int(diffs.numel()),
        "bitwise_equal_tokens": sampled_equal,
        "full_vocab_rows": rows,
        "full_vocab_rows_bitwise_equal": rows_equal,
        "rollout_train_logprob_abs_diff_mean": float(diffs.mean()) if diffs.numel() else 0.0,
        "rollout_train_logprob_abs_diff_max": float(diffs.max()) if diffs.numel() else 0.0,
        "k3_kl": float(k3.mean()) if k3.numel() else 0.0,
        "first_mismatch": first,
    }


def compare_routing(rollout_routing: list[Tensor], trainer_routing: list[Tensor | None]) -> dict:
    """Per completion: the experts the engine chose for each sampled token's row [n, layers, k] against
    the trainer's at the same positions. A token counts as mismatched when some MoE layer gave it another
    set of experts (ids compared sorted: the order of a token's slots is no part of its routing). None
    for both counts when the trainer recorded nothing: a model without MoE layers routes nothing."""
    if all(trained is None for trained in trainer_routing):
        return {"routing_compared_tokens": None, "routing_mismatch_tokens": None}
    compared = mismatched = 0
    for engine, trained in zip(rollout_routing, trainer_routing):
        same = (engine.sort(-1).values == trained.cpu().sort(-1).values).flatten(1).all(-1)  # [n]
        compared += same.numel()
        mismatched += int((~same).sum())
    return {"routing_compared_tokens": compared, "routing_mismatch_tokens": mismatched}
