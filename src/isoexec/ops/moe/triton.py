"""The MoE router and combine as Triton kernels, one program per BLOCK_T tokens; the experts' grouped
GEMMs are `experts_triton.py`.

- `router_kernel`: the gate logits [BLOCK_T, E] by one `tl.dot` walk over H in ascending BLOCK_K blocks
  (fp32 accumulation, no split-K), kept in fp32. Softmax: the row max, exp(logit - max) from libdevice
  (CUDA's accurate expf, as `activation.triton`), their `tl.sum` (a tree fixed by BLOCK_E and the warps)
  and a correctly rounded divide; sigmoid: 1 / (1 + exp(-logit)), correctly rounded. The selection
  scores add the correction bias; NaN scores select as -inf. Group-limited selection (DeepSeek-V3,
  GLM-4.7-Flash): a group's score is its best plus its second best, the `topk_group` best groups kept
  (ties to the lower group), the others' experts masked. Top-k: k rounds of the row max, taking the
  lowest expert id holding it among those not yet taken, so equal scores go to the lower id. The weights
  are the unbiased scores of the chosen experts, normalised by their sum in slot order and scaled.
- `combine_kernel`: a token's k routed rows summed in ascending expert id (k rounds of the lowest id not
  yet taken), weight × row in fp32, then the shared expert's row (times the sigmoid of its gate logit,
  where given) added, rounded once. No atomics: each program owns its tokens' output columns.

Every max, min and masked one-hot sum here is exact; the one rounding-sensitive reduction (softmax's
sum) is a function of BLOCK_E and the warps, both fixed per model. A token's bits never meet another
token's. The backward passes are `grads.py`'s: correct, not batch-invariant.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import triton_support
from ..activation.triton import exp_fp32
from ..common import expect_dtype, torch_dtype
from ..linear import tile_triton
from ..triton_support import cdiv, interpreting, jit, needs_grad, next_power_of_2, require_device, tl
from .grads import combine_grads, router_grads
from .reference import check_routing

ROUTER_ID, COMBINE_ID = "moe.router.triton", "moe.combine.triton"


@jit
def take_max(b_score, b_taken, o_e, BLOCK_E: tl.constexpr):
    """Per row, the lowest column among the not-taken ones holding their max: [BLOCK_T] column ids."""
    b_free = tl.where(b_taken, float("-inf"), b_score)
    b_max = tl.max(b_free, 1)
    return tl.min(tl.where((b_free == b_max[:, None]) & ~b_taken, o_e[None, :], BLOCK_E), 1)


@jit(do_not_specialize=["num_tokens"])
def router_kernel(
    x, w, bias, weights, ids,
    num_tokens, scale, eps,
    stride_xt, stride_xh, stride_we, stride_wh,
    H: tl.constexpr, E: tl.constexpr, TOP_K: tl.constexpr, NK: tl.constexpr,
    SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_J: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    i_t = tl.program_id(0)
    o_t = i_t.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < num_tokens
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E

    b_logits = tl.full([BLOCK_T, BLOCK_E], 0.0, dtype=tl.float32)
    for i_k in range(0, NK):
        o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
        m_k = o_k < H
        b_x = tl.load(x + o_t[:, None] * stride_xt + o_k[None, :] * stride_xh, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_w = tl.load(w + o_e[None, :] * stride_we + o_k[:, None] * stride_wh, mask=m_k[:, None] & m_e[None, :], other=0.0)
        b_logits = tile_triton.accumulate(b_x, b_w, b_logits, INTERPRETED)

    b_logits = tl.where(m_e[None, :], b_logits, float("-inf"))
    if SOFTMAX:
        b_exp = exp_fp32(b_logits - tl.max(b_logits, 1)[:, None], not INTERPRETED)
        b_score = tl.math.div_rn(b_exp, tl.sum(b_exp, 1)[:, None])
    else:
        b_score = tl.math.div_rn(1.0, 1.0 + exp_fp32(-b_logits, not INTERPRETED))
    b_choice = b_score
    if HAS_BIAS:
        b_choice = b_choice + tl.load(bias + o_e, mask=m_e, other=0.0).to(tl.float32)[None, :]
    b_choice = tl.where(m_e[None, :] & (b_choice == b_choice), b_choice, float("-inf"))  # NaN selects as -inf

    if N_GROUP > 1:
        GROUP: tl.constexpr = E // N_GROUP
        o_g = tl.arange(0, BLOCK_G)
        b_group = tl.full([BLOCK_T, BLOCK_G], float("-inf"), dtype=tl.float32)
        for g in tl.static_range(N_GROUP):
            m_in = (o_e >= g * GROUP) & (o_e < (g + 1) * GROUP)
            b_in = tl.where(m_in[None, :], b_choice, float("-inf"))
            b_first = take_max(b_in, ~m_in[None, :] & (o_t[:, None] >= 0), o_e, BLOCK_E)
            b_best = tl.max(b_in, 1)
            if GROUP > 1:
                b_best = b_best + tl.max(tl.where(o_e[None, :] == b_first[:, None], float("-inf"), b_in), 1)
            b_group = tl.where(o_g[None, :] == g, b_best[:, None], b_group)
        b_kept = (o_g[None, :] >= N_GROUP) & (o_t[:, None] >= 0)  # padding groups start taken
        for j in tl.static_range(TOPK_GROUP):
            b_kept = b_kept | (o_g[None, :] == take_max(b_group, b_kept, o_g, BLOCK_G)[:, None])
        m_keep = (o_e[None, :] < 0) & (o_t[:, None] >= 0)
        for g in tl.static_range(N_GROUP):
            b_keep_g = tl.max(tl.where((o_g[None, :] == g) & b_kept, 1, 0), 1) > 0
            m_keep = m_keep | (((o_e >= g * GROUP) & (o_e < (g + 1) * GROUP))[None, :] & b_keep_g[:, None])
        b_choice = tl.where(m_keep, b_choice, float("-inf"))

    o_j = tl.arange(0, BLOCK_J)
    b_taken = ~m_e[None, :] & (o_t[:, None] >= 0)  # padding experts start taken
    b_ids = tl.full([BLOCK_T, BLOCK_J], 0, dtype=tl.int64)
    b_weights = tl.full([BLOCK_T, BLOCK_J], 0.0, dtype=tl.float32)
    b_total = tl.full([BLOCK_T], 0.0, dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        b_id = take_max(b_choice, b_taken, o_e, BLOCK_E)
        m_id = o_e[None, :] == b_id[:, None]
        b_taken = b_taken | m_id
        b_weight = tl.sum(tl.where(m_id, b_score, 0.0), 1)  # one score plus zeros: exact
        b_total = b_total + b_weight
        b_ids = tl.where(o_j[None, :] == j, b_id.to(tl.int64)[:, None], b_ids)
        b_weights = tl.where(o_j[None, :] == j, b_weight[:, None], b_weights)
    if NORM:
        b_weights = tl.math.div_rn(b_weights, b_total[:, None] + eps)
    b_weights = b_weights * scale
    m_out = m_t[:, None] & (o_j < TOP_K)[None, :]
    p_out = o_t[:, None] * TOP_K + o_j[None, :]
    tl.store(weights + p_out, b_weights, mask=m_out)
    tl.store(ids + p_out, b_ids, mask=m_out)


def router_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, top_k: int, scoring: str, norm_topk_prob: bool, n_group: int,
               topk_group: int, routed_scaling_factor: float, *, block_t: int, block_k: int, num_warps: int) -> tuple[Tensor, Tensor]:
    num_tokens, hidden = x.shape
    num_experts = weight.shape[0]
    weights = x.new_empty((num_tokens, top_k), dtype=torch.float32)
    ids = x.new_empty((num_tokens, top_k), dtype=torch.int64)
    if num_tokens == 0:
        return weights, ids
    router_kernel[(cdiv(num_tokens, block_t),)](
        x, weight, x if bias is None else bias, weights, ids,
        num_tokens, float(routed_scaling_factor), 1e-20 if scoring == "sigmoid" else 0.0,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        H=hidden, E=num_experts, TOP_K=top_k, NK=cdiv(hidden, block_k),
        SOFTMAX=scoring == "softmax", HAS_BIAS=bias is not None, NORM=norm_topk_prob, N_GROUP=n_group, TOPK_GROUP=topk_group,
        BLOCK_T=block_t, BLOCK_E=max(16, next_power_of_2(num_experts)), BLOCK_K=block_k,
        BLOCK_G=next_power_of_2(n_group), BLOCK_J=next_power_of_2(top_k), INTERPRETED=interpreting(),
        num_warps=num_warps, enable_reflect_ftz=False,
    )
    return weights, ids


class _TritonRouter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, fwd, options):
        weights, ids = fwd(x, weight, bias)
        ctx.save_for_backward(x, weight, ids)
        ctx.options = options
        ctx.mark_non_differentiable(ids)
        return weights, ids

    @staticmethod
    def backward(ctx, grad_weights, grad_ids):
        x, weight, ids = ctx.saved_tensors
        grad_x, grad_w = router_grads(x, weight, ids, grad_weights, ctx.needs_input_grad[:2], **ctx.options)
        return grad_x, grad_w, None, None, None


def router(x: Tensor, weight: Tensor, bias: Tensor | None, top_k: int, scoring: str = "softmax", norm_topk_prob: bool = True,
           n_group: int = 1, topk_group: int = 1, routed_scaling_factor: float = 1.0, *, input_dtype: str, weight_dtype: str,
           accum_dtype: str, block_t: int, block_k: int, num_warps: int) -> tuple[Tensor, Tensor]:
    """x [T, H], weight [E, H], bias [E] -> weights [T, k] float32, ids [T, k] int64 (as `reference.router`)."""
    expect_dtype(x, input_dtype, "moe router input")
    expect_dtype(weight, weight_dtype, "moe router weight")
    check_routing(weight.shape[0], top_k, scoring, n_group, topk_group)
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"moe router: input has hidden {x.shape[-1]}, the gate weight {weight.shape[-1]}")
    require_device(ROUTER_ID, x, weight, bias)

    def fwd(x, weight, bias):
        return router_fwd(x, weight, bias, top_k, scoring, norm_topk_prob, n_group, topk_group, routed_scaling_factor,
                          block_t=block_t, block_k=block_k, num_warps=num_warps)

    if needs_grad(x, weight):
        options = dict(scoring=scoring, norm_topk_prob=norm_topk_prob, routed_scaling_factor=routed_scaling_factor)
        return _TritonRouter.apply(x, weight, bias, fwd, options)
    return fwd(x, weight, bias)


# Larger than any expert id: padding slots' id.
NO_EXPERT = 1 << 40


@jit(do_not_specialize=["num_tokens"])
def combine_kernel(
    routed, weights, ids, shared, gate, y,
    num_tokens,
    stride_rt, stride_rk, stride_rh, stride_wt, stride_wk, stride_it, stride_ik, stride_st, stride_sh, stride_gt,
    H: tl.constexpr, TOP_K: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_J: tl.constexpr, NO_EXPERT: tl.constexpr, INTERPRETED: tl.constexpr,
):
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    o_t = i_t.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    m_t = o_t < num_tokens
    o_h = i_h * BLOCK_H + tl.arange(0, BLOCK_H)
    m = m_t[:, None] & (o_h < H)[None, :]
    o_j = tl.arange(0, BLOCK_J)
    m_j = m_t[:, None] & (o_j < TOP_K)[None, :]
    b_ids = tl.load(ids + o_t[:, None] * stride_it + o_j[None, :] * stride_ik, mask=m_j, other=NO_EXPERT)  # [BLOCK_T, BLOCK_J]
    b_w = tl.load(weights + o_t[:, None] * stride_wt + o_j[None, :] * stride_wk, mask=m_j, other=0.0).to(tl.float32)
    b_taken = o_j[None, :] >= TOP_K  # padding slots start taken
    b_acc = tl.full([BLOCK_T, BLOCK_H], 0.0, dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        b_free = tl.where(b_taken, NO_EXPERT, b_ids)
        b_lowest = tl.min(b_free, 1)
        b_slot = tl.min(tl.where((b_free == b_lowest[:, None]) & ~b_taken, o_j[None, :], BLOCK_J), 1)  # [BLOCK_T]
        m_slot = o_j[None, :] == b_slot[:, None]
        b_taken = b_taken | m_slot
        b_weight = tl.sum(tl.where(m_slot, b_w, 0.0), 1)  # one weight plus zeros: exact
        b_row = tl.load(routed + o_t[:, None] * stride_rt + b_slot[:, None] * stride_rk + o_h[None, :] * stride_rh, mask=m, other=0.0)
        b_acc = b_acc + b_weight[:, None] * b_row.to(tl.float32)
    if HAS_SHARED:
        b_shared = tl.load(shared + o_t[:, None] * stride_st + o_h[None, :] * stride_sh, mask=m, other=0.0).to(tl.float32)
        if HAS_GATE:
            b_gate = tl.load(gate + o_t * stride_gt, mask=m_t, other=0.0).to(tl.float32)
            b_shared = b_shared * tl.math.div_rn(1.0, 1.0 + exp_fp32(-b_gate, not INTERPRETED))[:, None]
        b_acc = b_acc + b_shared
    tl.store(y + o_t[:, None] * H + o_h[None, :], b_acc.to(y.dtype.element_ty), mask=m)


def combine_fwd(routed: Tensor, weights: Tensor, ids: Tensor, shared: Tensor | None, shared_gate: Tensor | None, out_dtype: torch.dtype,
                *, block_t: int, block_h: int, num_warps: int) -> Tensor:
    num_tokens, top_k, hidden = routed.shape
    y = routed.new_empty((num_tokens, hidden), dtype=out_dtype)
    if num_tokens == 0:
        return y
    gate = None if shared_gate is None else shared_gate.reshape(num_tokens, -1)  # [T, 1]
    combine_kernel[(cdiv(num_tokens, block_t), cdiv(hidden, block_h))](
        routed, weights, ids, routed if shared is None else shared, routed if gate is None else gate, y,
        num_tokens,
        *routed.stride(), *weights.stride(), *ids.stride(),
        *((0, 0) if shared is None else shared.stride()), 0 if gate is None else gate.stride(0),
        H=hidden, TOP_K=top_k, HAS_SHARED=shared is not None, HAS_GATE=gate is not None,
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_J=next_power_of_2(top_k), NO_EXPERT=NO_EXPERT,
        INTERPRETED=interpreting(), num_warps=num_warps, enable_reflect_ftz=False,
    )
    return y


class _TritonCombine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, routed, weights, ids, shared, shared_gate, fwd):
        ctx.save_for_backward(routed, weights, shared, shared_gate)
        return fwd(routed, weights, ids, shared, shared_gate)

    @staticmethod
    def backward(ctx, grad):
        routed, weights, shared, shared_gate = ctx.saved_tensors
        grad_routed, grad_weights, grad_shared, grad_gate = combine_grads(routed, weights, grad, shared, shared_gate)
        return grad_routed, grad_weights, None, grad_shared, grad_gate, None


def combine(routed: Tensor, weights: Tensor, ids: Tensor, shared: Tensor | None = None, shared_gate: Tensor | None = None, *,
            input_dtype: str, output_dtype: str, accum_dtype: str, block_t: int, block_h: int, num_warps: int) -> Tensor:
    """routed [T, k, H], weights [T, k], ids [T, k], shared [T, H], shared_gate [T, 1] -> [T, H] (as `reference.combine`)."""
    expect_dtype(routed, input_dtype, "moe combine input")
    if weights.shape != ids.shape or tuple(ids.shape) != tuple(routed.shape[:2]):
        raise ValueError(f"{COMBINE_ID}: weights {tuple(weights.shape)} and ids {tuple(ids.shape)} must be the routed rows' [T, k]")
    require_device(COMBINE_ID, routed, weights, ids, shared, shared_gate)

    def fwd(routed, weights, ids, shared, shared_gate):
        return combine_fwd(routed, weights, ids, shared, shared_gate, torch_dtype(output_dtype), block_t=block_t, block_h=block_h,
                           num_warps=num_warps)

    if needs_grad(routed, weights, shared, shared_gate):
        return _TritonCombine.apply(routed, weights, ids, shared, shared_gate, fwd)
    return fwd(routed, weights, ids, shared, shared_gate)


def check_constants(constants: dict) -> None:
    """Refuse constants the MoE kernels do not implement (ValueError naming the impl)."""
    for name in ("accum_dtype", "compute_dtype"):
        if constants.get(name, "float32") != "float32":
            raise ValueError(f'the Triton MoE kernels accumulate and compute in float32 only, got {name} = "{constants[name]}"')
    for name in ("block_t", "block_h", "block_m", "block_n", "block_k"):
        value = constants.get(name, 16)
        if value < 16 or value & (value - 1):
            raise ValueError(f"the Triton MoE kernels: {name} must be a power of two >= 16 (tl.dot's smallest tile), got {value}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16) or constants.get("num_stages", 1) < 1:
        raise ValueError("the Triton MoE kernels: num_warps must be a power of two <= 16 and num_stages >= 1")
    if constants.get("input_dtype") != constants.get("weight_dtype", constants.get("input_dtype")):
        raise ValueError("the Triton MoE GEMMs need input_dtype = weight_dtype")


SOURCES = (router_kernel, combine_kernel, take_max, exp_fp32, tile_triton, triton_support)
