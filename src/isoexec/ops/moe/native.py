"""The ordinary MoE path, as transformers' eager Qwen3-MoE and most engines run it: the gate GEMM in the
model dtype, `softmax` / `sigmoid`, `torch.topk` (no order promised among equal scores), one GEMM per
expert over the tokens it got, and an `index_add_` of weight × output per expert. The baseline the
bitwise checks must see fail.

`experts_grouped_mm` is transformers 5's default experts path instead (`experts_implementation =
"grouped_mm"`): the routed rows sorted by expert and one `torch._grouped_mm` (cuBLAS's grouped GEMM on
a GPU) for gate_up and one for down over all experts, offsets from a histogram, so nothing waits on the
host. The fast non-invariant experts `benchmarks/contracts/fast-baseline.toml` runs."""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import torch_dtype


def router(x: Tensor, weight: Tensor, bias: Tensor | None, top_k: int, scoring: str = "softmax", norm_topk_prob: bool = True,
           n_group: int = 1, topk_group: int = 1, routed_scaling_factor: float = 1.0, *, input_dtype: str, weight_dtype: str,
           accum_dtype: str) -> tuple[Tensor, Tensor]:
    logits = F.linear(x, weight).float()  # [T, E]
    scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
    choice = scores if bias is None else scores + bias.float()
    if n_group > 1:
        grouped = choice.unflatten(-1, (n_group, -1))
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
        mask = torch.zeros_like(group_scores).scatter_(-1, group_scores.topk(topk_group, dim=-1).indices, 1.0)
        choice = grouped.masked_fill(mask[..., None] == 0, 0.0).flatten(-2)
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(-1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if scoring == "sigmoid" else 0.0))
    return weights * routed_scaling_factor, ids


def experts(x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor, *, input_dtype: str, weight_dtype: str, output_dtype: str,
            accum_dtype: str, compute_dtype: str) -> Tensor:
    num_tokens, top_k = ids.shape
    out = x.new_zeros((num_tokens, top_k, x.shape[-1]), dtype=torch_dtype(output_dtype))
    for expert in torch.unique(ids).tolist():
        token, slot = torch.where(ids == expert)
        gate, up = F.linear(x[token], gate_up[expert]).chunk(2, dim=-1)
        out[token, slot] = F.linear(F.silu(gate) * up, down[expert]).to(out.dtype)
    return out


def experts_grouped_mm(x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor, *, input_dtype: str, weight_dtype: str, output_dtype: str,
                       accum_dtype: str, compute_dtype: str) -> Tensor:
    num_tokens, top_k = ids.shape
    num_experts = gate_up.shape[0]
    sorted_ids, order = torch.sort(ids.reshape(-1))
    # histc, not bincount (whose output size is read on the host); on the CPU histc takes floats only
    counts = torch.histc(sorted_ids.float() if x.device.type == "cpu" else sorted_ids.int(), bins=num_experts, min=0, max=num_experts - 1)
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    gate, up = torch._grouped_mm(x[order // top_k], gate_up.transpose(1, 2), offs=offsets).chunk(2, dim=-1)  # [T k, I] each
    out = torch._grouped_mm(F.silu(gate) * up, down.transpose(1, 2), offs=offsets)  # [T k, H], in expert order
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    return out[back].view(num_tokens, top_k, -1).to(torch_dtype(output_dtype))


def check_grouped_mm_geometry(constants: dict, geometry: dict) -> None:
    """torch._grouped_mm needs every row 16-byte aligned: refuse, when the contract is fitted, a model whose
    hidden or expert width breaks that."""
    itemsize = torch_dtype(constants["input_dtype"]).itemsize
    for _, inter, _ in geometry.get("moe", ()):
        for name, width in (("hidden_size", geometry["hidden_size"]), ("moe_intermediate_size", inter)):
            if width * itemsize % 16:
                raise ValueError(f"{name} {width}: moe.experts.grouped_mm (torch._grouped_mm) needs rows of a multiple of 16 bytes")


def combine(routed: Tensor, weights: Tensor, ids: Tensor, shared: Tensor | None = None, shared_gate: Tensor | None = None, *,
            input_dtype: str, output_dtype: str, accum_dtype: str) -> Tensor:
    out = routed.new_zeros((routed.shape[0], routed.shape[-1]), dtype=torch_dtype(output_dtype))
    for expert in torch.unique(ids).tolist():
        token, slot = torch.where(ids == expert)
        out.index_add_(0, token, (routed[token, slot] * weights[token, slot, None].to(routed.dtype)).to(out.dtype))
    if shared is not None:
        out = out + (shared if shared_gate is None else torch.sigmoid(shared_gate).reshape(-1, 1) * shared).to(out.dtype)
    return out
