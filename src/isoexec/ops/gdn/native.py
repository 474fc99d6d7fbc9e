"""Gated DeltaNet as transformers, vLLM and flash-linear-attention compute it: two forms.

Runs of more than one token (training, prefill) take the chunk form, chunks counted from the run's
first token, with the UT system solved by `torch.linalg.solve_triangular` and the in-chunk products as
matmuls; a run of one token (decode) takes the recurrent step from the running state. The cache's
`state` holds that running state (after the sequence's last token); `rows` is not used (`row_width` 1).
The two forms are different arithmetic, so a decoded row is not the bits the trainer computes for it.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import torch_dtype
from .reference import L2_EPS, check_inputs, check_runs, run_spans
from .runs import find_runs


def row_width(num_v_heads: int, k_dim: int, v_dim: int, constants: dict | None = None) -> int:
    """native keeps the running state alone and never reads the rows: the engine gives it one float a row."""
    return 1


def _normalized(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def _chunk_form(q, k, v, g, beta, state, chunk_size):
    """q, k [L, Hv, Dk], v [L, Hv, Dv], g, β [L, Hv], state [Hv, Dk, Dv] -> (o [L, Hv, Dv], final state)."""
    length = q.shape[0]
    pad = -length % chunk_size
    q, k, v, g, beta = (F.pad(x.movedim(0, 1), (0, 0, 0, pad) if x.dim() == 3 else (0, pad)) for x in (q, k, v, g, beta))  # heads first
    heads = q.shape[0]
    q, k, v = (x.reshape(heads, -1, chunk_size, x.shape[-1]) for x in (q, k, v))  # [Hv, n, C, D]
    g, beta = g.reshape(heads, -1, chunk_size), beta.reshape(heads, -1, chunk_size)
    c = g.cumsum(-1)  # [Hv, n, C]
    future = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(future, float("-inf")).exp()  # [Hv, n, C, C]
    system = ((k * beta[..., None]) @ k.transpose(-1, -2) * decay).tril(-1) + torch.eye(chunk_size, device=q.device, dtype=q.dtype)
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k * (beta * c.exp())[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    out = torch.empty_like(u)
    for n in range(q.shape[1]):
        delta = u[:, n] - w[:, n] @ state
        out[:, n] = (q[:, n] * c[:, n, :, None].exp()) @ state + intra[:, n] @ delta
        last = c[:, n, -1]
        state = state * last.exp()[:, None, None] + (k[:, n] * (last[:, None] - c[:, n]).exp()[..., None]).transpose(-1, -2) @ delta
    return out.reshape(heads, -1, out.shape[-1])[:, :length].movedim(0, 1), state


def _recurrent_step(q, k, v, g, beta, state):
    """One token: q, k [Hv, Dk], v [Hv, Dv], g, β [Hv], state [Hv, Dk, Dv] -> (o [Hv, Dv], new state)."""
    state = state * g.exp()[:, None, None]
    delta = (v - (state * k[:, :, None]).sum(1)) * beta[:, None]
    state = state + k[:, :, None] * delta[:, None, :]
    return (state * q[:, :, None]).sum(1), state


def gdn_core(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, state: Tensor | None = None,
             rows: Tensor | None = None, state_ids: Tensor | None = None, positions: Tensor | None = None, *, input_dtype: str,
             output_dtype: str, chunk_size: int) -> Tensor:
    """Same arguments and result as `reference.gdn_core`, the cache's state being the running state."""
    if positions is None:
        raise ValueError("gdn.core: positions are required")
    num_k_heads, num_v_heads, k_dim, v_dim = check_inputs(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size,
                                                          input_dtype, None)
    runs = find_runs(positions, state_ids)
    check_runs(runs, state)
    group = num_v_heads // num_k_heads
    beta = b.float().sigmoid()
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    qn = (_normalized(q.float()) * k_dim**-0.5).repeat_interleave(group, dim=1)
    kn = _normalized(k.float()).repeat_interleave(group, dim=1)
    vf = v.float()
    outputs = []
    for start, stop, first, slot in run_spans(runs, q.shape[0]):
        running = vf.new_zeros((num_v_heads, k_dim, v_dim)) if first == 0 else state[slot].float()
        span = slice(start, stop)
        if stop - start == 1:
            out, running = _recurrent_step(qn[start], kn[start], vf[start], g[start], beta[start], running)
            out = out[None]
        else:
            out, running = _chunk_form(qn[span], kn[span], vf[span], g[span], beta[span], running, chunk_size)
        outputs.append(out)
        if state is not None:
            with torch.no_grad():
                state[slot] = running
    out = torch.cat(outputs) if outputs else vf.new_zeros((0, num_v_heads, v_dim))
    return out.to(torch_dtype(output_dtype))
