"""Mixture of experts, invariant by construction: a token's routing, its experts' outputs and their sum
depend only on the token's own hidden row.

- `router`: gate logits in fp32 through `linear.reference` (fixed K blocks), scores by softmax (max and
  sum over experts by fixed trees, exp from torch's size-invariant exp) or sigmoid written as
  1 / (1 + exp(-x)); DeepSeek-style group-limited selection (a group's score: the sum of its top-2);
  top-k by a stable sort, so among equal scores the lower expert index wins; weights from the
  unbiased scores, normalised by their sum in slot order, times `routed_scaling_factor`.
- `experts`: each (token, slot)'s SwiGLU expert FFN, the rows routed to one expert gathered and run
  through `linear.reference` and `activation.reference`, whose row bits never depend on how many rows
  share the call.
- `combine`: the k routed outputs of a token summed in ascending expert id, weight × output in fp32,
  then the shared expert's output added (times the sigmoid of its gate logit, where the family gates
  it), one rounding at the end.

The backward pass is autograd over the same ops (the router's selection is not differentiated; its
weights are): correct, not batch-invariant.
"""

import torch
from torch import Tensor

from ..common import expect_dtype, torch_dtype
from ..activation import reference as activation
from ..linear import reference as linear
from ..reduce import tree_max, tree_sum

SCORINGS = ("softmax", "sigmoid")


def _stable_topk(scores: Tensor, k: int) -> Tensor:
    """Indices of the k largest along the last dim; equal scores in ascending index order."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def check_routing(num_experts: int, top_k: int, scoring: str, n_group: int, topk_group: int) -> None:
    """Refuse a routing no router can run (ValueError naming the field)."""
    if scoring not in SCORINGS:
        raise ValueError(f"moe router: scoring {scoring!r} is not one of {', '.join(SCORINGS)}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"moe router: top_k {top_k} must be between 1 and the {num_experts} experts")
    if n_group < 1 or num_experts % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"moe router: {num_experts} experts in {n_group} groups, {topk_group} of them kept, is not a grouping")
    if top_k > topk_group * (num_experts // n_group):
        raise ValueError(f"moe router: top_k {top_k} exceeds the {topk_group * (num_experts // n_group)} experts of the {topk_group} groups kept")


def router(x: Tensor, weight: Tensor, bias: Tensor | None, top_k: int, scoring: str = "softmax", norm_topk_prob: bool = True,
           n_group: int = 1, topk_group: int = 1, routed_scaling_factor: float = 1.0, *, input_dtype: str, weight_dtype: str,
           accum_dtype: str, block_k: int, block_tree: str, tree: str) -> tuple[Tensor, Tensor]:
    """x [T, H], weight [E, H] (the gate), bias [E] (`e_score_correction_bias`, selection only) ->
    weights [T, k] float32, expert ids [T, k] int64, slot j holding the j-th highest score."""
    check_routing(weight.shape[0], top_k, scoring, n_group, topk_group)
    num_experts = weight.shape[0]
    logits = linear.linear(x, weight, None, input_dtype=input_dtype, weight_dtype=weight_dtype, output_dtype="float32",
                           accum_dtype=accum_dtype, block_k=block_k, block_tree=block_tree, tree=tree)  # [T, E]
    if scoring == "softmax":
        e = (logits - tree_max(logits, block_tree)[..., None]).exp()
        scores = e / tree_sum(e, block_tree)[..., None]
    else:
        scores = 1.0 / (1.0 + (-logits).exp())
    choice = scores if bias is None else scores + bias.to(torch.float32)
    if n_group > 1:
        grouped = choice.unflatten(-1, (n_group, num_experts // n_group))  # [T, G, E/G]
        top2 = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2]
        group_scores = top2[..., 0] + (top2[..., 1] if top2.shape[-1] > 1 else 0.0)  # [T, G]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(-1, _stable_topk(group_scores, topk_group), True)
        choice = torch.where(keep[..., None], grouped, float("-inf")).flatten(-2)
    ids = _stable_topk(choice.detach(), top_k)  # [T, k]
    weights = scores.gather(-1, ids)  # [T, k]
    if norm_topk_prob:
        total = weights[..., 0]
        for j in range(1, top_k):
            total = total + weights[..., j]
        weights = weights / (total[..., None] + (1e-20 if scoring == "sigmoid" else 0.0))
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids


def experts(x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor, *, input_dtype: str, weight_dtype: str, output_dtype: str,
            accum_dtype: str, compute_dtype: str, block_k: int, block_tree: str, tree: str) -> Tensor:
    """x [T, H], ids [T, k], gate_up [E, 2I, H] (gate rows first), down [E, H, I] -> [T, k, H] in
    output_dtype: slot j of token t is expert ids[t, j]'s down(silu(gate x) * up x)."""
    expect_dtype(x, input_dtype, "moe experts input")
    num_tokens, top_k = ids.shape
    out_dtype = torch_dtype(output_dtype)
    gemm = dict(weight_dtype=weight_dtype, accum_dtype=accum_dtype, block_k=block_k, block_tree=block_tree, tree=tree)
    flat_ids = ids.reshape(-1)  # [T k], row r = token r // k, slot r % k
    rows = []
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=gate_up.shape[0]).tolist()
    start, pieces = 0, []
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        routed = order[start : start + count]
        start += count
        h = x[routed // top_k]  # [n, H]
        gate, up = linear.linear(h, gate_up[expert], None, input_dtype=input_dtype, output_dtype=input_dtype, **gemm).chunk(2, dim=-1)
        act = activation.silu_mul(gate, up, input_dtype=input_dtype, output_dtype=input_dtype, compute_dtype=compute_dtype)
        pieces.append(linear.linear(act, down[expert], None, input_dtype=input_dtype, output_dtype=output_dtype, **gemm))
        rows.append(routed)
    out = x.new_zeros((num_tokens * top_k, x.shape[-1]), dtype=out_dtype)
    if pieces:
        out = out.index_copy(0, torch.cat(rows), torch.cat(pieces))  # a copy per row: each row written once
    return out.view(num_tokens, top_k, x.shape[-1])


def combine(routed: Tensor, weights: Tensor, ids: Tensor, shared: Tensor | None = None, shared_gate: Tensor | None = None, *,
            input_dtype: str, output_dtype: str, accum_dtype: str) -> Tensor:
    """routed [T, k, H], weights [T, k], ids [T, k] -> [T, H]: sum over slots in ascending expert id of
    weight × output in accum_dtype; then the shared expert's output shared [T, H], times
    sigmoid(shared_gate [T, 1]) where given (Qwen3-Next, Qwen3.5), added; rounded once."""
    expect_dtype(routed, input_dtype, "moe combine input")
    accum = torch_dtype(accum_dtype)
    order = torch.argsort(ids, dim=-1, stable=True)  # [T, k]
    terms = routed.to(accum).gather(1, order[..., None].expand(-1, -1, routed.shape[-1])) * weights.to(accum).gather(1, order)[..., None]
    total = terms[:, 0] if terms.shape[1] else routed.new_zeros(routed.shape[0], routed.shape[-1], dtype=accum)
    for j in range(1, terms.shape[1]):
        total = total + terms[:, j]
    if shared is not None:
        term = shared.to(accum)
        if shared_gate is not None:
            term = term * (1.0 / (1.0 + (-shared_gate.to(accum).reshape(-1, 1)).exp()))
        total = total + term
    return total.to(torch_dtype(output_dtype))
