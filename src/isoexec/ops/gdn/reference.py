"""Gated DeltaNet's core by chunk-form rows (CPR), one op order for training, prefill chunks and decode.

Tokens fall in absolute chunks of C positions, [0, C), [C, 2C) … of their sequence. The row at offset i
of a chunk is computed from the fp32 state S₀ at the chunk's start and the chunk's rows 0 … i alone,
always by the same op sequence (README.md writes it out):

    c_i  = c_{i-1} + g_i                                    the in-chunk decay cumsum, in row order
    a_ij = β_i (k_i · k_j) exp(c_i - c_j), j < i            the UT system's row i
    w_i  = β_i exp(c_i) k_i - Σ_j a_ij w_j                  forward substitution, row i from rows < i
    u_i  = β_i v_i          - Σ_j a_ij u_j
    δ_i  = u_i - S₀ᵀ w_i                                    the delta-rule value ("v_new")
    o_i  = exp(c_i) S₀ᵀ q_i + Σ_{j ≤ i} (q_i · k_j) exp(c_i - c_j) δ_j

and when row C - 1 closes the chunk, S₀ ← exp(c_{C-1}) S₀ + Σ_j exp(c_{C-1} - c_j) k_j δ_jᵀ. Every sum
over j runs over all C rows of the chunk in a fixed tree with the rows a row does not see zeroed by
`where`, and every sum over a head dimension is `blocked_sum`: so a row's bits never depend on which
call computed its chunk's other rows, on T, or on the batch. A decode step is row i of the open chunk:
the engine keeps S₀ and the open chunk's rows (k, w, u, δ, c of each) per sequence, O(C) work a step,
never O(context).

The gating is part of the op, in fp32: β = sigmoid(b), g = -exp(A_log) · softplus(a + dt_bias),
sigmoid written from exp (torch.sigmoid is not batch-invariant on CPU, docs/experiments.md); q and k
are l2-normalised and q scaled by Dk^-0.5. Value head h reads key head h // (Hv / Hk).

The backward pass is plain autograd over the same ops: gradients are correct, not invariant.
"""

import torch
from torch import Tensor

from ..common import expect_dtype, torch_dtype
from ..reduce import blocked_sum, tree_sum
from .runs import find_runs

L2_EPS = 1e-6  # l2norm's epsilon in Qwen3-Next / Qwen3.5 (and flash-linear-attention)
SOFTPLUS_THRESHOLD = 20.0  # torch's softplus returns x itself above this


def row_width(num_v_heads: int, k_dim: int, v_dim: int, constants: dict | None = None) -> int:
    """Floats a cached open-chunk row holds per value head: k, w (Dk each), u, δ (Dv each), c (whatever the entry's
    constants)."""
    return 2 * k_dim + 2 * v_dim + 1


def gates(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, accum: torch.dtype) -> tuple[Tensor, Tensor]:
    """a, b [T, Hv] -> (g, β) [T, Hv] in `accum`: g = -exp(A_log) softplus(a + dt_bias), β = sigmoid(b)."""
    x = a.to(accum) + dt_bias.to(accum)
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(torch.where(x > SOFTPLUS_THRESHOLD, 0.0, x))))
    g = -torch.exp(a_log.to(accum)) * softplus
    beta = 1.0 / (1.0 + torch.exp(-b.to(accum)))
    return g, beta


def l2_normalized(x: Tensor, block: int, block_tree: str, tree: str) -> Tensor:
    """x [..., D] in fp32 -> x * rsqrt(Σ x² + eps), the sum by `blocked_sum`."""
    return x * torch.rsqrt(blocked_sum(x * x, block, block_tree, tree) + L2_EPS)[..., None]


def run_spans(runs, num_tokens: int) -> list[tuple[int, int, int, int | None]]:
    """(start, stop, first position, slot or None) of each run of a call's `runs.find_runs`."""
    if num_tokens == 0:
        return []
    stops = [*runs.first[1:].tolist(), num_tokens]
    slots = [None] * len(stops) if runs.first_slots is None else runs.first_slots.tolist()
    return list(zip(runs.first.tolist(), stops, runs.first_positions.tolist(), slots))


class _Chunk:
    """One sequence's open chunk while a call walks it: S₀ and rows 0 … i-1 as [C, Hv, …] tensors (rows not
    yet computed hold whatever the cache held: every read of them is removed by `where`)."""

    def __init__(self, state: Tensor, rows: Tensor, k_dim: int, v_dim: int):
        self.state = state  # [Hv, Dk, Dv]
        self.k, self.w = rows[..., :k_dim], rows[..., k_dim : 2 * k_dim]  # [C, Hv, Dk]
        self.u, self.delta = rows[..., 2 * k_dim : 2 * k_dim + v_dim], rows[..., 2 * k_dim + v_dim : 2 * k_dim + 2 * v_dim]  # [C, Hv, Dv]
        self.c = rows[..., -1]  # [C, Hv]

    def rows(self) -> Tensor:
        return torch.cat([self.k, self.w, self.u, self.delta, self.c[..., None]], dim=-1)

    def put(self, i: int, **values: Tensor) -> None:
        """Row i's values (out of place, so autograd sees every step)."""
        for name, value in values.items():
            old = getattr(self, name)
            setattr(self, name, torch.cat([old[:i], value[None], old[i + 1 :]]))


def _row(chunk: _Chunk, i: int, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, reduce: dict) -> Tensor:
    """Row i of `chunk` (q, k [Hv, Dk] normalised, v [Hv, Dv], g, β [Hv]): stores its k, w, u, δ, c in the
    chunk and returns o_i [Hv, Dv]."""
    num_rows = chunk.c.shape[0]
    j = torch.arange(num_rows, device=q.device)
    before, upto = (j < i)[:, None], (j <= i)[:, None]  # [C, 1]
    c = (chunk.c[i - 1] if i > 0 else torch.zeros_like(g)) + g  # [Hv]

    def dots(x: Tensor, rows: Tensor) -> Tensor:  # x [Hv, D], rows [C, Hv, D] -> [C, Hv]
        return blocked_sum(x[None] * rows, **reduce)

    def over_rows(weights: Tensor, rows: Tensor, mask: Tensor) -> Tensor:  # Σ_j weights[j] rows[j], j in mask -> [Hv, D]
        terms = torch.where(mask[..., None], weights[..., None] * rows, 0.0)  # [C, Hv, D]
        return tree_sum(terms.movedim(0, -1), reduce["block_tree"])

    def times_state(x: Tensor) -> Tensor:  # x [Hv, Dk] -> S₀ᵀ x [Hv, Dv], the sum over Dk by blocked_sum
        return blocked_sum((x[:, :, None] * chunk.state).transpose(-1, -2), **reduce)

    decay = torch.exp(torch.where(before, c[None] - chunk.c, float("-inf")))  # [C, Hv]
    a = torch.where(before, beta[None] * dots(k, chunk.k) * decay, 0.0)  # [C, Hv]
    w = beta[:, None] * torch.exp(c)[:, None] * k - over_rows(a, chunk.w, before)  # [Hv, Dk]
    u = beta[:, None] * v - over_rows(a, chunk.u, before)  # [Hv, Dv]
    delta = u - times_state(w)  # [Hv, Dv]
    chunk.put(i, k=k, w=w, u=u, delta=delta, c=c)

    inter = torch.exp(c)[:, None] * times_state(q)  # [Hv, Dv]
    scores = torch.where(upto, dots(q, chunk.k) * torch.exp(torch.where(upto, c[None] - chunk.c, float("-inf"))), 0.0)  # [C, Hv]
    o = inter + over_rows(scores, chunk.delta, upto)
    if i == num_rows - 1:  # the chunk closes: the state at the next chunk's start
        keys = chunk.k * torch.exp(c[None] - chunk.c)[..., None]  # [C, Hv, Dk]
        update = tree_sum((keys[..., None] * chunk.delta[:, :, None, :]).movedim(0, -1), reduce["block_tree"])  # [Hv, Dk, Dv]
        chunk.state = torch.exp(c)[:, None, None] * chunk.state + update
    return o


def check_inputs(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size, input_dtype, width):
    """Shapes and dtypes of a call, shared by the impls; `width`: the floats per value head of the calling
    impl's cache rows (its `row_width`), None for an impl that does not read them. The values (state ids' range,
    runs' first positions) are `check_runs`' from the host's copy of the runs. -> (Hk, Hv, Dk, Dv)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
        expect_dtype(t, input_dtype, f"gdn.core {name}")
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[0] != q.shape[0]:
        raise ValueError(f"gdn.core: q, k must be [T, Hk, Dk] and v [T, Hv, Dv], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    num_tokens, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    if num_k_heads == 0 or num_v_heads % num_k_heads:
        raise ValueError(f"gdn.core: {num_v_heads} value heads are not a multiple of {num_k_heads} key heads")
    for name, t in (("a", a), ("b", b)):
        if t.shape != (num_tokens, num_v_heads):
            raise ValueError(f"gdn.core: {name} must be [T, Hv] = [{num_tokens}, {num_v_heads}], got {tuple(t.shape)}")
    for name, t in (("A_log", a_log), ("dt_bias", dt_bias)):
        if t.shape != (num_v_heads,):
            raise ValueError(f"gdn.core: {name} must be [Hv] = [{num_v_heads}], got {tuple(t.shape)}")
    if positions.dim() != 1 or positions.shape[0] != num_tokens or positions.is_floating_point():
        raise ValueError(f"gdn.core: positions must be [T] integers, got {positions.dtype} of shape {tuple(positions.shape)}")
    if (state is None) != (rows is None) or (state is None) != (state_ids is None):
        raise ValueError("gdn.core: state, rows and state_ids come together (the engine's cache) or not at all (a trainer forward)")
    if state is not None:
        if state.dtype != torch.float32 or state.dim() != 4 or state.shape[1:] != (num_v_heads, k_dim, v_dim):
            raise ValueError(f"gdn.core: state must be float32 [N, {num_v_heads}, {k_dim}, {v_dim}], got {state.dtype} {tuple(state.shape)}")
        width = rows.shape[-1] if width is None else width
        if rows.dtype != torch.float32 or rows.shape != (state.shape[0], chunk_size, num_v_heads, width):
            raise ValueError(f"gdn.core: rows must be float32 [N, {chunk_size}, {num_v_heads}, {width}], got {rows.dtype} {tuple(rows.shape)}")
        if state_ids.shape != (num_tokens,) or state_ids.is_floating_point():
            raise ValueError(f"gdn.core: state_ids must be [T] integers, got {state_ids.dtype} of shape {tuple(state_ids.shape)}")
    return num_k_heads, num_v_heads, k_dim, v_dim


def check_runs(runs, state: Tensor | None) -> None:
    """The value checks of a call, from its `runs.find_runs` (None while a CUDA graph is captured: none)."""
    if runs is None:
        return
    if state is not None and runs.slots is not None and (runs.slots[0] < 0 or runs.slots[1] >= state.shape[0]):
        raise ValueError(f"gdn.core: a state id lies outside the cache's {state.shape[0]} slots")
    if state is None and runs.first_positions.any():
        raise ValueError(f"gdn.core: without a cache every run starts at position 0, one starts at {int(runs.first_positions.max())}")


def gdn_core(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, state: Tensor | None = None,
             rows: Tensor | None = None, state_ids: Tensor | None = None, positions: Tensor | None = None, *, input_dtype: str,
             output_dtype: str, accum_dtype: str, chunk_size: int, reduce_block: int, block_tree: str, tree: str) -> Tensor:
    """The gated delta rule over runs of consecutive tokens.

    q, k [T, Hk, Dk], v [T, Hv, Dv] (after the conv), a, b [T, Hv] (in_proj_a / in_proj_b outputs),
    A_log, dt_bias [Hv]; positions [T]: absolute positions. A run (consecutive tokens of one sequence, the
    same state id, positions rising by one) continues its sequence where the cache left it:
    state [N, Hv, Dk, Dv] fp32, S₀ of each slot's open chunk, and rows [N, C, Hv, 2 Dk + 2 Dv + 1] fp32,
    its rows so far (`row_width`), both updated in place; state_ids [T] the slot of each token. Without a
    cache (a trainer forward) every run starts at position 0 from a zero state. Returns [T, Hv, Dv] in
    output_dtype.
    """
    if positions is None:
        raise ValueError("gdn.core: positions are required")
    num_k_heads, num_v_heads, k_dim, v_dim = check_inputs(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size,
                                                          input_dtype, row_width(v.shape[1], q.shape[-1], v.shape[-1]))
    runs = find_runs(positions, state_ids)
    check_runs(runs, state)
    accum = torch_dtype(accum_dtype)
    reduce = dict(block=reduce_block, block_tree=block_tree, tree=tree)
    group = num_v_heads // num_k_heads
    g, beta = gates(a, b, a_log, dt_bias, accum)
    qn = l2_normalized(q.to(accum), **reduce) * (k_dim**-0.5)
    kn = l2_normalized(k.to(accum), **reduce)
    qn, kn = qn.repeat_interleave(group, dim=1), kn.repeat_interleave(group, dim=1)  # [T, Hv, Dk]
    vf = v.to(accum)
    width = row_width(num_v_heads, k_dim, v_dim)
    outputs = []
    for start, stop, first, slot in run_spans(runs, q.shape[0]):
        if first == 0:  # a sequence starts from a zero state, whatever its cache slot held before
            chunk = _Chunk(q.new_zeros((num_v_heads, k_dim, v_dim), dtype=accum), q.new_zeros((chunk_size, num_v_heads, width), dtype=accum),
                           k_dim, v_dim)
        else:
            chunk = _Chunk(state[slot].to(accum), rows[slot].to(accum), k_dim, v_dim)
        for t in range(start, stop):
            i = (first + t - start) % chunk_size
            outputs.append(_row(chunk, i, qn[t], kn[t], vf[t], g[t], beta[t], reduce))
        if state is not None:
            with torch.no_grad():
                state[slot] = chunk.state.to(state.dtype)
                rows[slot] = chunk.rows().to(rows.dtype)
    out = torch.stack(outputs) if outputs else vf.new_zeros((0, num_v_heads, v_dim))
    return out.to(torch_dtype(output_dtype))
