"""The routed experts' SwiGLU FFNs as two invariant grouped GEMMs: pinned tiles, no split-K, fp32 accumulation.

The T·k routed (token, slot) rows are put in expert order by a stable argsort (data movement only), so
each expert's rows are one contiguous segment of the sorted order, its bounds found by `searchsorted`.
A tile is BLOCK_M consecutive rows of one expert's segment: an expert with n rows has ceil(n / BLOCK_M)
tiles, numbered in ascending expert id. Program i_t finds its expert and first row from the segment
bounds alone (`expert_tile`), so the grid is an upper bound the host knows without reading the routing,
ceil(T k / BLOCK_M) + min(E, T k) row tiles, and programs past the last tile return at once: nothing
waits on the host, and decode steps capture as CUDA graphs.

- `gate_up_kernel`: a tile's rows gathered from x by token, against BLOCK_N of expert e's gate rows and
  the same BLOCK_N of its up rows, two fp32 accumulators walking H in ascending BLOCK_K blocks; each
  rounded once to the input dtype (the reference's gate and up), then silu(gate) * up in fp32 by
  `activation.triton`'s own tile function, rounded once into an activation buffer in sorted order [T k, I].
- `down_kernel`: those activation rows against expert e's down rows over I, rounded once to the output
  dtype and stored straight to the row's (token, slot) place in [T k, H].

A row's bits depend on its x row, its expert's weights and the tile constants: never on which rows share
its tile or how many rows its expert got, as `linear.triton`'s rows never depend on M (the battery shows
it on each device). Decode (a few rows on each of many experts) and training (thousands per expert) run
the same tiles. Rows past a segment load zeros and are never stored. The per-tile arithmetic is
`linear/tile_triton.py`'s.

The backward pass is `grads.experts_grads`, reusing the forward's sorted order and its rounded gate and
up (stored by `gate_up_kernel` when autograd records): correct, not batch-invariant.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import triton_support
from ..activation import triton as activation_triton
from ..common import expect_dtype, torch_dtype
from ..linear import tile_triton
from ..linear.triton import SHARED_MEMORY_BYTES
from ..triton_support import cdiv, interpreting, jit, needs_grad, next_power_of_2, require_device, tl
from .grads import experts_grads

@jit
def expert_tile(starts, i_t, E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr):
    """(expert, first sorted row, end of the expert's rows) of row tile i_t; expert == E past the last tile.
    starts [E + 1]: where each expert's rows begin in the sorted order, then T k."""
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E
    b_start = tl.load(starts + o_e, mask=m_e, other=0)
    b_stop = tl.load(starts + 1 + o_e, mask=m_e, other=0)
    b_tiles = (b_stop - b_start + BLOCK_M - 1) // BLOCK_M  # [BLOCK_E], 0 on padding lanes
    b_end = tl.cumsum(b_tiles, 0)  # tile after each expert's last
    expert = tl.sum(((b_end <= i_t) & m_e).to(tl.int32), 0)
    is_e = o_e == expert
    first_tile = tl.sum(tl.where(is_e, b_end - b_tiles, 0), 0)
    start = tl.sum(tl.where(is_e, b_start, 0), 0)
    stop = tl.sum(tl.where(is_e, b_stop, 0), 0)
    return expert, start + (i_t - first_tile) * BLOCK_M, stop


@jit(do_not_specialize=["num_rows"])
def gate_up_kernel(
    x, order, starts, w, act, pre,
    num_rows,
    stride_xt, stride_xh, stride_we, stride_wn, stride_wh,
    TOP_K: tl.constexpr, E: tl.constexpr, H: tl.constexpr, I: tl.constexpr, NK: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    STORE_PRE: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """act[r, n] for the sorted rows r of tile i_t and columns n of block i_n: silu(gate) * up; with
    STORE_PRE, also the rounded gate and up at pre[r, n] and pre[r, I + n] (for the backward pass)."""
    i_t, i_n = tl.program_id(0), tl.program_id(1)
    expert, row, stop = expert_tile(starts, i_t, E, BLOCK_E, BLOCK_M)
    if expert < E:
        o_r = row + tl.arange(0, BLOCK_M)
        m_r = o_r < stop
        b_token = tl.load(order + o_r, mask=m_r, other=0) // TOP_K  # [BLOCK_M]
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = o_n < I
        p_gate = w + expert.to(tl.int64) * stride_we + o_n[None, :] * stride_wn
        p_up = p_gate + I * stride_wn
        b_gate = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
        b_up = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
        for i_k in range(0, NK):
            o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
            m_k = o_k < H
            b_x = tl.load(x + b_token[:, None] * stride_xt + o_k[None, :] * stride_xh, mask=m_r[:, None] & m_k[None, :], other=0.0)
            m_w = m_k[:, None] & m_n[None, :]
            b_gate = tile_triton.accumulate(b_x, tl.load(p_gate + o_k[:, None] * stride_wh, mask=m_w, other=0.0), b_gate, INTERPRETED)
            b_up = tile_triton.accumulate(b_x, tl.load(p_up + o_k[:, None] * stride_wh, mask=m_w, other=0.0), b_up, INTERPRETED)
        b_gate = b_gate.to(act.dtype.element_ty)
        b_up = b_up.to(act.dtype.element_ty)
        m_out = m_r[:, None] & m_n[None, :]
        if STORE_PRE:
            tl.store(pre + o_r[:, None] * (2 * I) + o_n[None, :], b_gate, mask=m_out)
            tl.store(pre + o_r[:, None] * (2 * I) + I + o_n[None, :], b_up, mask=m_out)
        b_act = activation_triton.silu_mul_fp32(b_gate.to(tl.float32), b_up.to(tl.float32), not INTERPRETED)
        tl.store(act + o_r[:, None] * I + o_n[None, :], b_act.to(act.dtype.element_ty), mask=m_out)


@jit(do_not_specialize=["num_rows"])
def down_kernel(
    act, order, starts, w, y,
    num_rows,
    stride_we, stride_wn, stride_wk, stride_yr, stride_yn,
    E: tl.constexpr, H: tl.constexpr, I: tl.constexpr, NK: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """y[order[r], n] = act[r] · down[e, n] for the sorted rows r of tile i_t and columns n of block i_n."""
    i_t, i_n = tl.program_id(0), tl.program_id(1)
    expert, row, stop = expert_tile(starts, i_t, E, BLOCK_E, BLOCK_M)
    if expert < E:
        o_r = row + tl.arange(0, BLOCK_M)
        m_r = o_r < stop
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_n = o_n < H
        p_w = w + expert.to(tl.int64) * stride_we + o_n[None, :] * stride_wn
        b_acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
        for i_k in range(0, NK):
            o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
            m_k = o_k < I
            b_a = tl.load(act + o_r[:, None] * I + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.0)
            b_w = tl.load(p_w + o_k[:, None] * stride_wk, mask=m_k[:, None] & m_n[None, :], other=0.0)
            b_acc = tile_triton.accumulate(b_a, b_w, b_acc, INTERPRETED)
        b_flat = tl.load(order + o_r, mask=m_r, other=0)
        tl.store(y + b_flat[:, None] * stride_yr + o_n[None, :] * stride_yn, b_acc.to(y.dtype.element_ty), mask=m_r[:, None] & m_n[None, :])


def pipeline_stages(num_stages: int, rows: int, block_k: int, itemsize: int) -> int:
    """As many of the pinned stages as fit in SHARED_MEMORY_BYTES with `rows` rows of BLOCK_K operands a
    stage (x's and the weight tiles'): fp32 operands, in the battery's float32 pass, take fewer. Stages
    decide when tiles are loaded, never the arithmetic; the count depends on the tile and dtype alone."""
    return max(1, min(num_stages, SHARED_MEMORY_BYTES // (rows * block_k * itemsize)))


def experts_fwd(x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor, out_dtype: torch.dtype, *, block_m: int, block_n: int,
                block_k: int, num_warps: int, num_stages: int, keep: bool = False) -> Tensor | tuple[Tensor, tuple]:
    """x [T, H], ids [T, k], gate_up [E, 2I, H], down [E, H, I] -> [T, k, H] in `out_dtype`; with `keep`, also
    what the backward pass reuses: (order [T k], each expert's rows' end [E] int32, gate and up [T k, 2I])."""
    num_tokens, top_k = ids.shape
    num_experts, hidden, inter = down.shape
    num_rows = num_tokens * top_k
    y = x.new_empty((num_rows, hidden), dtype=out_dtype)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # [T k]: sorted position -> (token, slot) row
    starts = torch.searchsorted(flat[order], torch.arange(num_experts + 1, device=x.device, dtype=flat.dtype))  # [E + 1]
    act = x.new_empty((num_rows, inter))  # [T k, I], sorted order
    pre = x.new_empty((num_rows, 2 * inter)) if keep else None  # [T k, 2I], sorted order
    if num_rows:
        tiles = cdiv(num_rows, block_m) + min(num_experts, num_rows)
        common = dict(E=num_experts, BLOCK_E=next_power_of_2(num_experts), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                      INTERPRETED=interpreting(), num_warps=num_warps)
        gate_up_kernel[(tiles, cdiv(inter, block_n))](
            x, order, starts, gate_up, act, act if pre is None else pre,
            num_rows,
            x.stride(0), x.stride(1), gate_up.stride(0), gate_up.stride(1), gate_up.stride(2),
            TOP_K=top_k, H=hidden, I=inter, NK=cdiv(hidden, block_k), STORE_PRE=keep,
            num_stages=pipeline_stages(num_stages, block_m + 2 * block_n, block_k, x.element_size()),
            # libdevice's exp without flush-to-zero, as activation.triton's
            enable_reflect_ftz=False, **common,
        )
        down_kernel[(tiles, cdiv(hidden, block_n))](
            act, order, starts, down, y,
            num_rows,
            down.stride(0), down.stride(1), down.stride(2), y.stride(0), y.stride(1),
            H=hidden, I=inter, NK=cdiv(inter, block_k), num_stages=pipeline_stages(num_stages, block_m + block_n, block_k, x.element_size()),
            **common,
        )
    y = y.view(num_tokens, top_k, hidden)
    return (y, (order, starts[1:].to(torch.int32), pre)) if keep else y


class _TritonExperts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ids, gate_up, down, fwd):
        y, (order, offsets, pre) = fwd(x, ids, gate_up, down, keep=True)
        ctx.save_for_backward(x, ids, gate_up, down, order, offsets, pre)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, ids, gate_up, down, order, offsets, pre = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], *ctx.needs_input_grad[2:4])
        grad_x, grad_gate_up, grad_down = experts_grads(x, ids, gate_up, down, grad, needs, routing=(order, offsets, pre))
        return grad_x, None, grad_gate_up, grad_down, None


def check_shapes(impl_id: str, x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor) -> None:
    num_experts, hidden, inter = down.shape
    if x.dim() != 2 or ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"{impl_id}: x [T, H] and ids [T, k] must have one row per token, got {tuple(x.shape)} and {tuple(ids.shape)}")
    if x.shape[1] != hidden or tuple(gate_up.shape) != (num_experts, 2 * inter, hidden):
        raise ValueError(f"{impl_id}: gate_up {tuple(gate_up.shape)} and down {tuple(down.shape)} are not [E, 2I, H] and [E, H, I] "
                         f"for hidden {x.shape[1]}")


def experts(x: Tensor, ids: Tensor, gate_up: Tensor, down: Tensor, *, input_dtype: str, weight_dtype: str, output_dtype: str,
            accum_dtype: str, compute_dtype: str, block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int) -> Tensor:
    """x [T, H], ids [T, k], gate_up [E, 2I, H] (gate rows first), down [E, H, I] -> [T, k, H] in output_dtype.
    ids must lie in [0, E), as a router's do: checking would cost a host sync, and a row whose id lies
    outside falls in no expert's segment and is left unwritten."""
    impl_id = "moe.experts.triton"
    expect_dtype(x, input_dtype, "moe experts input")
    expect_dtype(gate_up, weight_dtype, "moe experts gate_up weight")
    expect_dtype(down, weight_dtype, "moe experts down weight")
    check_shapes(impl_id, x, ids, gate_up, down)
    require_device(impl_id, x, gate_up, down)
    fwd = functools.partial(experts_fwd, out_dtype=torch_dtype(output_dtype), block_m=block_m, block_n=block_n, block_k=block_k,
                            num_warps=num_warps, num_stages=num_stages)
    if needs_grad(x, gate_up, down):
        return _TritonExperts.apply(x, ids.contiguous(), gate_up, down, fwd)
    return fwd(x, ids.contiguous(), gate_up, down)


SOURCES = (gate_up_kernel, down_kernel, expert_tile, activation_triton.silu_mul_fp32, activation_triton.exp_fp32, tile_triton, triton_support)
