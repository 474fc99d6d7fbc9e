"""Gradients of the MoE regions for the Triton impls: correct, not batch-invariant (the forward is the
contract's; the trainer's backward only has to be right).

The router's and the combine's are small and recomputed in fp32 by autograd. The experts' are written
out on the routed rows in expert order, each product one `torch._grouped_mm` (cuBLAS's grouped GEMM on a
GPU): the [E, ...] weight gradients come from one grouped GEMM each, and the forward's sorted order and
pre-activations are reused where the forward kept them (`experts_triton` does when autograd records), and
on a GPU the SwiGLU's backward is `activation.triton`'s kernel;
where torch lacks it or the shapes break its 16-byte stride rule, per expert with ordinary matmuls
(`experts_grads_per_expert`: differentiating a per-expert slice of the weights through autograd instead
would materialise a zero gradient of the whole tensor per expert). Matmuls run in the weights' dtype on a
GPU (tensor cores, fp32 accumulation inside, as `linear.reference.linear_grads` does), in fp32 on the CPU.
"""

import torch
from torch import Tensor


def router_grads(x: Tensor, weight: Tensor, ids: Tensor, grad: Tensor, needs: tuple[bool, bool], *, scoring: str, norm_topk_prob: bool,
                 routed_scaling_factor: float) -> tuple[Tensor | None, Tensor | None]:
    """(grad_x, grad_weight) of the routing weights [T, k] at the chosen `ids` (the selection itself,
    and the correction bias that only steers it, have no gradient)."""
    with torch.enable_grad():
        xf = x.detach().float().requires_grad_(needs[0])
        wf = weight.detach().float().requires_grad_(needs[1])
        logits = xf @ wf.T  # [T, E]
        scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
        weights = scores.gather(-1, ids)  # [T, k]
        if norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if scoring == "sigmoid" else 0.0))
        weights = weights * routed_scaling_factor
        inputs = [t for t in (xf, wf) if t.requires_grad]
        got = iter(torch.autograd.grad(weights, inputs, grad.float()) if inputs else ())
    return tuple(next(got).to(t.dtype) if need else None for t, need in ((x, needs[0]), (weight, needs[1])))


def combine_grads(routed: Tensor, weights: Tensor, grad: Tensor, shared: Tensor | None, shared_gate: Tensor | None) -> tuple:
    """(grad_routed, grad_weights, grad_shared, grad_shared_gate) of
    out = Σ_j weights[:, j] routed[:, j] + sigmoid(shared_gate) shared."""
    g = grad.float()
    # In the routed rows' dtype, with no [T, k, H] temporary in fp32: a bf16 product per element, and
    # the weights' gradient as a batched matrix-vector product (fp32 accumulation inside).
    grad_routed = weights.to(routed.dtype)[..., None] * grad.to(routed.dtype)[:, None, :]  # [T, k, H]
    grad_weights = torch.bmm(routed, grad.to(routed.dtype)[..., None])[..., 0].to(weights.dtype)  # [T, k]
    grad_shared = grad_gate = None
    if shared is not None:
        gate = torch.ones_like(g[:, :1]) if shared_gate is None else shared_gate.float().reshape(-1, 1).sigmoid()  # [T, 1]
        grad_shared = (gate * g).to(shared.dtype)
        if shared_gate is not None:
            grad_gate = ((shared.float() * g).sum(-1, keepdim=True) * gate * (1 - gate)).reshape(shared_gate.shape).to(shared_gate.dtype)
    return grad_routed, grad_weights, grad_shared, grad_gate


def _compute_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    return weight.dtype if x.is_cuda else torch.promote_types(weight.dtype, torch.float32)


def _grouped_mm_fits(x: Tensor, gate_up: Tensor, down: Tensor) -> bool:
    item = _compute_dtype(x, gate_up).itemsize
    return hasattr(torch, "_grouped_mm") and all(n * item % 16 == 0 for n in (x.shape[-1], down.shape[-1]))


def experts_grads(x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor, grad: Tensor, needs: tuple[bool, bool, bool],
                  routing: tuple[Tensor, Tensor, Tensor] | None = None) -> tuple:
    """(grad_x, grad_gate_up, grad_down) of out [T, k, H], out[t, j] = down[e] (silu(g) * u), (g, u) = gate_up[e] x[t],
    e = ids[t, j]; `needs` says which of x, gate_up, down want one. `routing`: what the forward kept, where it
    did — (order [T k] of the rows by expert, each expert's rows' end [E] as int32, the rows' g and u [T k, 2I]
    in that order) — so that nothing is recomputed."""
    if not _grouped_mm_fits(x, gate_up, down):
        return experts_grads_per_expert(x, ids, gate_up, down, grad, needs)
    top_k, hidden = ids.shape[1], x.shape[-1]
    dtype = _compute_dtype(x, gate_up)
    w_gu, w_d = gate_up.to(dtype), down.to(dtype)
    if routing is None:
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        offsets = torch.cumsum(torch.bincount(flat, minlength=gate_up.shape[0]), 0).to(torch.int32)
        pre = torch._grouped_mm(x.to(dtype)[order // top_k], w_gu.transpose(1, 2), offs=offsets)  # [T k, 2I]
    else:
        order, offsets, pre = routing
    rows = x.to(dtype)[order // top_k]  # [T k, H], sorted
    gate, up = pre.to(dtype).chunk(2, dim=-1)  # [T k, I] each
    dy = grad.reshape(-1, hidden)[order].to(dtype)  # [T k, H], sorted
    d_act = torch._grouped_mm(dy, w_d, offs=offsets)  # [T k, I]
    act, d_gate, d_up = swiglu_grads(gate, up, d_act, fused=x.is_cuda)
    grad_down = torch._grouped_mm(dy.T, act, offs=offsets).to(down.dtype) if needs[2] else None  # [E, H, I]
    d_pre = torch.cat([d_gate, d_up], dim=-1)  # [T k, 2I]
    grad_gate_up = torch._grouped_mm(d_pre.T, rows, offs=offsets).to(gate_up.dtype) if needs[1] else None  # [E, 2I, H]
    grad_x = None
    if needs[0]:
        d_rows = torch._grouped_mm(d_pre, w_gu, offs=offsets)  # [T k, H], sorted
        # back to (token, slot) order, the k slots summed in fp32 without an fp32 copy of the rows
        grad_x = torch.empty_like(d_rows).index_copy_(0, order, d_rows).view(-1, top_k, hidden).sum(1, dtype=torch.float32).to(x.dtype)
    return grad_x, grad_gate_up, grad_down


def swiglu_grads(gate: Tensor, up: Tensor, d_act: Tensor, fused: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(silu(g) u, d_gate, d_up) for gate, up, d_act [R, I], in their dtype, computed in fp32. `fused`:
    by `activation.triton`'s two kernels (one pass each) instead of a dozen torch passes over [R, I]."""
    if fused:
        from ..activation import triton as activation_triton

        return (activation_triton.silu_mul_fwd(gate, up, gate.dtype), *activation_triton.silu_mul_bwd(gate, up, d_act))
    g, u, d = gate.float(), up.float(), d_act.float()
    sig = g.sigmoid()
    return (g * sig * u).to(gate.dtype), (d * u * sig * (1 + g * (1 - sig))).to(gate.dtype), (d * g * sig).to(gate.dtype)


def experts_grads_per_expert(x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor, grad: Tensor, needs: tuple[bool, bool, bool]) -> tuple:
    """`experts_grads` by one set of matmuls per expert with rows."""
    num_tokens, top_k = ids.shape
    hidden, inter = x.shape[-1], down.shape[-1]
    dtype = _compute_dtype(x, gate_up)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    g_out = grad.reshape(-1, hidden)
    grad_rows = x.new_zeros((num_tokens * top_k, hidden), dtype=torch.float32) if needs[0] else None
    grad_gate_up = torch.zeros_like(gate_up) if needs[1] else None  # experts without rows get zeros
    grad_down = torch.zeros_like(down) if needs[2] else None
    start = 0
    for expert, count in enumerate(counts):
        rows = order[start : start + count]
        start += count
        if count == 0:
            continue
        h = x[rows // top_k].to(dtype)  # [n, H]
        w_gu, w_d = gate_up[expert].to(dtype), down[expert].to(dtype)
        gate, up = (h @ w_gu.T).float().split(inter, dim=-1)  # [n, I] each
        sig = gate.sigmoid()
        act = gate * sig * up
        dy = g_out[rows].to(dtype)  # [n, H]
        d_act = (dy @ w_d).float()
        if grad_down is not None:
            grad_down[expert] = dy.T @ act.to(dtype)
        d_gate_up = torch.cat([d_act * up * sig * (1 + gate * (1 - sig)), d_act * gate * sig], dim=-1).to(dtype)  # [n, 2I]
        if grad_gate_up is not None:
            grad_gate_up[expert] = d_gate_up.T @ h
        if grad_rows is not None:
            grad_rows[rows] = (d_gate_up @ w_gu).float()
    grad_x = None if grad_rows is None else grad_rows.view(num_tokens, top_k, hidden).sum(1).to(x.dtype)
    return grad_x, grad_gate_up, grad_down

