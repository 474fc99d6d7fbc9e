"""gdn.conv as Triton kernels: y[t] = silu(Σ_w weight[:, w] · x_at(p_t - (W-1) + w)), as `conv.py`'s reference
defines it (runs, the slot's last W-1 inputs, zeros before position 0), without a host sync, so a decode
step can be captured in a CUDA graph.

`gdn_conv_kernel` computes a [BT, BD] tile of outputs: each token finds how many of the W-1 tokens before
it belong to its run (consecutive positions, the same slot), takes each lag's input from x, from its
slot or as zero, and sums the W products in fp32 in ascending w, then silu as z / (1 + exp(-z)). An
output element is a function of its own W inputs and weights alone, whatever the tile or the other
tokens of the call. `gdn_conv_state_kernel` then writes each run's slot: a kernel of its own, because a
token of the first may still read the slot its run's last token would overwrite. The backward pass
recomputes through the reference under autograd: correct gradients, not invariant ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, torch_dtype
from ..triton_support import after_upstream, cdiv, jit, needs_grad, next_power_of_2, require_device, tl, triton_available
from . import conv
from .runs import find_runs

ID = "gdn.conv.triton"
BLOCK_T, BLOCK_D = 16, 128  # the tile: an element's bits do not depend on it


@jit
def _run_offset(positions, state_ids, o_t, pos, slot, m_t, caching, W: tl.constexpr):
    """How many of the W-1 tokens before each token o_t are in its run (each one's predecessor too)."""
    offset = tl.zeros_like(pos)
    cont = m_t
    for lag in tl.static_range(1, W):
        prev = o_t - lag
        ok = cont & (prev >= 0)
        ok = ok & (tl.load(positions + prev, mask=ok, other=-1) == pos - lag)
        ok = ok & (~caching | (tl.load(state_ids + prev, mask=ok & caching, other=-1) == slot))
        offset += ok.to(offset.dtype)
        cont = ok
    return offset


@jit
def _input_at(x, conv_state, o_t, o_d, m_t, m_d, pos, slot, offset, lag, stride_xt, D, caching, W: tl.constexpr):
    """[BT, BD] inputs at positions p_t - lag: from x within the run, else from the slot, else zero."""
    in_run = offset >= lag
    from_x = tl.load(x + (o_t - lag)[:, None] * stride_xt + o_d[None, :], mask=(m_t & in_run)[:, None] & m_d[None, :], other=0.0)
    m_state = (m_t & ~in_run & (pos >= lag) & caching)[:, None] & m_d[None, :]
    column = (W - 1) - lag + offset
    from_state = tl.load(conv_state + slot[:, None] * ((W - 1) * D) + column[:, None] * D + o_d[None, :], mask=m_state, other=0.0)
    return tl.where(in_run[:, None], from_x, from_state)


@jit(do_not_specialize=["T", "D", "stride_xt", "stride_yt", "has_state"], dependent=True)
def gdn_conv_kernel(x, weight, y, conv_state, state_ids, positions, T, D, stride_xt, stride_yt, has_state,
                    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, PDL: tl.constexpr = False):
    after_upstream(PDL)
    o_t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    o_d = tl.program_id(1) * BD + tl.arange(0, BD)
    m_t, m_d = o_t < T, o_d < D
    caching = has_state != 0
    pos = tl.load(positions + o_t, mask=m_t, other=0)
    slot = tl.load(state_ids + o_t, mask=m_t & caching, other=0).to(tl.int64)
    offset = _run_offset(positions, state_ids, o_t, pos, slot, m_t, caching, W)
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    for w in tl.static_range(W):
        inputs = _input_at(x, conv_state, o_t, o_d, m_t, m_d, pos, slot, offset, W - 1 - w, stride_xt, D, caching, W).to(tl.float32)
        acc = acc + tl.load(weight + o_d * W + w, mask=m_d, other=0.0).to(tl.float32)[None, :] * inputs
    out = acc / (1.0 + tl.exp(-acc))
    tl.store(y + o_t[:, None] * stride_yt + o_d[None, :], out.to(y.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])


@jit(do_not_specialize=["T", "D", "stride_xt"], dependent=True)
def gdn_conv_state_kernel(x, conv_state, state_ids, positions, T, D, stride_xt, W: tl.constexpr, CW: tl.constexpr, BD: tl.constexpr,
                          PDL: tl.constexpr = False):
    """The slot of each run whose last token is program 0's token <- the W-1 inputs up to it."""
    after_upstream(PDL)
    i_t = tl.program_id(0).to(tl.int64)
    o_d = tl.program_id(1) * BD + tl.arange(0, BD)
    m_d = o_d < D
    pos = tl.load(positions + i_t)
    slot = tl.load(state_ids + i_t).to(tl.int64)
    has_next = i_t + 1 < T
    continues = tl.load(positions + i_t + 1, mask=has_next, other=-1) == pos + 1
    continues = continues & (tl.load(state_ids + i_t + 1, mask=has_next, other=-1) == slot)
    if not continues:
        offset = 0  # how many of the W-1 tokens before it are in its run
        cont = pos >= 0
        for back in tl.static_range(1, W):
            ok = cont & (i_t - back >= 0)
            ok = ok & (tl.load(positions + i_t - back, mask=ok, other=-1) == pos - back)
            ok = ok & (tl.load(state_ids + i_t - back, mask=ok, other=-1) == slot)
            offset += ok.to(tl.int32)
            cont = ok
        columns = tl.arange(0, CW)  # column c of the slot: the input at p - (W - 2 - c)
        lag = (W - 2) - columns
        m_c = columns < W - 1
        in_run = (offset >= lag) & m_c
        from_x = tl.load(x + (i_t - lag)[:, None] * stride_xt + o_d[None, :], mask=in_run[:, None] & m_d[None, :], other=0.0)
        m_state = (m_c & ~in_run & (pos >= lag))[:, None] & m_d[None, :]
        p_slot = conv_state + slot * ((W - 1) * D)
        from_state = tl.load(p_slot + ((W - 1) - lag + offset)[:, None] * D + o_d[None, :], mask=m_state, other=0.0)
        values = tl.where(in_run[:, None], from_x, from_state)
        tl.debug_barrier()  # every read of the old slot before any write
        tl.store(p_slot + columns[:, None] * D + o_d[None, :], values, mask=m_c[:, None] & m_d[None, :])


def conv_fwd(x: Tensor, weight: Tensor, conv_state: Tensor | None, state_ids: Tensor | None, positions: Tensor,
             out_dtype: torch.dtype) -> Tensor:
    num_tokens, num_dims = x.shape
    width = weight.shape[1]
    y = x.new_empty((num_tokens, num_dims), dtype=out_dtype)
    if num_tokens == 0:
        return y
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight, positions = weight.contiguous(), positions.contiguous()
    has_state = conv_state is not None
    if has_state and not conv_state.is_contiguous():
        raise ValueError(f"{ID}: conv_state must be contiguous (the kernels write it in place)")
    ids = state_ids.contiguous() if has_state else positions
    state = conv_state if has_state else x
    grid = (cdiv(num_tokens, BLOCK_T), cdiv(num_dims, BLOCK_D))
    gdn_conv_kernel[grid](x, weight, y, state, ids, positions, num_tokens, num_dims, x.stride(0), y.stride(0), int(has_state),
                          W=width, BT=BLOCK_T, BD=BLOCK_D, num_warps=4)
    if has_state and width > 1:
        gdn_conv_state_kernel[(num_tokens, cdiv(num_dims, BLOCK_D))](
            x, conv_state, ids, positions, num_tokens, num_dims, x.stride(0), W=width, CW=max(2, next_power_of_2(width - 1)),
            BD=BLOCK_D, num_warps=4)
    return y


class _TritonConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, positions, constants):
        ctx.save_for_backward(x, weight, positions)
        ctx.constants = constants
        return conv_fwd(x, weight, None, None, positions, torch_dtype(constants["output_dtype"]))

    @staticmethod
    def backward(ctx, grad):
        x, weight, positions = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(need) for t, need in zip((x, weight), ctx.needs_input_grad[:2])]
        with torch.enable_grad():
            # The forward checked these inputs: no host reads again.
            out = conv.conv_rows(*leaves, None, None, positions, ctx.constants["accum_dtype"], ctx.constants["output_dtype"])
        wanted = [t for t in leaves if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad.to(out.dtype), allow_unused=True))
        return (*(next(grads) if t.requires_grad else None for t in leaves), None, None)


def check_constants(constants: dict) -> None:
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    for name in ("input_dtype", "output_dtype", "weight_dtype"):
        if constants[name] not in triton_support.BOUNDARY_DTYPES:
            raise ValueError(f"{ID}: {name} must be one of {', '.join(triton_support.BOUNDARY_DTYPES)}, got {constants[name]!r}")


def causal_conv(x: Tensor, weight: Tensor, conv_state: Tensor | None, state_ids: Tensor | None, positions: Tensor, *, input_dtype: str,
                output_dtype: str, weight_dtype: str, accum_dtype: str) -> Tensor:
    """`conv.causal_conv`'s arguments and result. Outside a CUDA graph capture, the reference's checks of
    the input (one-line errors for bad ids and positions), their values from the host's copy of the runs."""
    constants = dict(input_dtype=input_dtype, output_dtype=output_dtype, weight_dtype=weight_dtype, accum_dtype=accum_dtype)
    check_constants(constants)
    require_device(ID, x, weight)
    if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        conv._check_inputs(x, weight, conv_state, state_ids, positions, input_dtype, weight_dtype)
        conv.check_runs(find_runs(positions, state_ids), conv_state)  # one host read a forward (runs.py)
    if needs_grad(x, weight):
        if conv_state is not None:
            raise ValueError(f"{ID}: a call that records gradients is a trainer forward: it takes no conv_state")
        return _TritonConv.apply(x, weight, positions, constants)
    return conv_fwd(x, weight, conv_state, state_ids, positions, torch_dtype(output_dtype))


SOURCES = (gdn_conv_kernel, gdn_conv_state_kernel, _run_offset, _input_at, triton_support)


def register(registry) -> None:
    """Register gdn.conv.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="gdn.conv", cases=ALL_CASES, fn=causal_conv,
                               check_constants=check_constants, sources=SOURCES))
