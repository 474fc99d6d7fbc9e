"""GRPO and DAPO objectives over the generated tokens of a rollout batch.

Shapes: a batch of N completions flattened to T generated tokens; `seq_index` [T] says which
completion each token belongs to. Advantages are per completion, broadcast to its tokens.
"""

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """(r - mean of the group) / (std of the group + eps): rewards [N] in consecutive groups -> [N]."""
    groups = rewards.view(-1, group_size)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, unbiased=False, keepdim=True) + eps)).view(-1)


def informative_groups(rewards: Tensor, group_size: int) -> Tensor:
    """DAPO dynamic sampling: [N] mask keeping groups whose rewards are not all equal (they carry no gradient)."""
    groups = rewards.view(-1, group_size)
    keep = (groups != groups[:, :1]).any(1)
    return keep.repeat_interleave(group_size)


def overlong_penalty(lengths: Tensor, truncated: Tensor, max_tokens: int, buffer: int, penalty: float) -> Tensor:
    """DAPO soft overlong punishment: 0 up to max_tokens - buffer, then linearly down to -penalty at
    max_tokens; a completion cut off by the length limit gets -penalty."""
    soft = torch.clamp((max_tokens - buffer - lengths).float() / max(buffer, 1), max=0.0) * penalty
    return torch.where(truncated, torch.full_like(soft, -penalty), soft)


def policy_loss(logp: Tensor, logp_old: Tensor, advantages: Tensor, seq_index: Tensor, *, eps_low: float, eps_high: float,
                aggregation: str, weights: Tensor | None = None) -> tuple[Tensor, dict]:
    """Clipped surrogate −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A), ρ = exp(logp − logp_old), per token [T].

    aggregation "token" (DAPO) averages over all tokens of the batch; "sequence" (GRPO) averages within
    each completion first. `weights` [T] (truncated importance sampling) multiply each token's term.
    """
    ratio = torch.exp(logp - logp_old)
    adv = advantages[seq_index]
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    per_token = -surrogate if weights is None else -surrogate * weights
    if aggregation == "token":
        loss = per_token.mean()
    elif aggregation == "sequence":
        # index_put_ with accumulate adds in token order on every device (index_add_ adds by atomics on a GPU):
        # the reported loss is the same bits run to run.
        count = torch.zeros(int(seq_index.max()) + 1 if seq_index.numel() else 0, dtype=per_token.dtype, device=per_token.device)
        count = count.index_put((seq_index,), torch.ones_like(per_token), accumulate=True)
        sums = torch.zeros_like(count).index_put((seq_index,), per_token, accumulate=True)
        loss = (sums / count.clamp(min=1))[count > 0].mean()
    else:
        raise ValueError(f'aggregation must be "token" or "sequence", got {aggregation!r}')
    clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
    return loss, {"clip_fraction": float(clipped.float().mean()) if clipped.numel() else 0.0}
