"""attention.triton's decode rows over spans (`split_kv_size` > 0), in two launches.

With `split_kv_size` S > 0 the contract's row walks its keys in absolute spans [0, S), [S, 2S) …: within a span the
walk of every other case (triton.py's module doc) from a fresh state, then the spans' states combined in ascending
order (`triton_steps._combine`), in training, prefill chunks and decode alike (`triton_steps._walk` does both in one
program). A span's state depends on nothing outside the span, so a decode step computes the same values in two
launches:

1. `span_kernel`, one program per (query, KV head, span): the walk over the span's blocks, by `_walk` on the same
   64-row tile as the training walk (the tile decides an MMA's bits, not which rows fill it), its state (m, l, acc)
   stored;
2. `combine_kernel`, programs per (query, KV head) over slices of the columns: the stored states combined in
   ascending span order by the walk's `_combine`, then the walk's division and zero select.

Each row reads its keys and values once, as a flash-decoding split does; what stays serial is the combine, one
multiply-add per element a span. The span kernel launches without programmatic dependent launch and the combine
with it, as `triton_blocks.py` found best for its many-program kernel and the fold behind it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ...env import switch
from .. import triton_support
from ..triton_support import after_upstream, cdiv, jit, tl
from .triton_blocks import _decode_rows, decode_tile
from .triton_steps import _combine, _finish, _walk

# Off (ISOEXEC_ATTENTION_SPANS=0), a decode call walks its spans in one program as training does (`_walk`): the same
# bits, for measuring this path against it.
ENABLED: bool = switch("ISOEXEC_ATTENTION_SPANS", True)
# The combine's programs a (query, KV head), each over head_dim / COMBINE_SPLIT of acc's columns, their warps, and
# the spans' states it has in flight.
COMBINE_SPLIT = 4
COMBINE_WARPS = 2
COMBINE_STAGES = 4


@jit(do_not_specialize=["L", "S"])  # not dependent: the module doc says why
def span_kernel(
    q, k, v, slot_table, seq_ids, positions, ms, ls, accs, L, S, scale,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_sb,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, SPAN: tl.constexpr, NSPAN: tl.constexpr, PAIRED: tl.constexpr,
):
    """Program (query i, KV head, span c): the walk's state after the span's blocks of the row, into ms / ls
    [i, KV head, c, :G_PAD] and accs [i, KV head, c, :G_PAD, :]; nothing for a span past the row's last key."""
    i, kv_head, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    p_i = tl.load(positions + i).to(tl.int32)
    hi_key = tl.minimum(p_i, L - 1)
    hi_blk = tl.where(hi_key >= 0, hi_key // BLOCK_N + 1, 0)
    lo = c * SPAN
    if lo < hi_blk:
        seq_row = slot_table + tl.load(seq_ids + i).to(tl.int64) * stride_sb
        b_q, row_ok = _decode_rows(q, i, kv_head, stride_qt, stride_qh, G, G_PAD, D, ROWS, DOT_IN_FP32)
        pos = tl.where(row_ok, p_i, -1)
        hi = tl.minimum(lo + SPAN, hi_blk)
        full = tl.minimum(tl.maximum((hi_key + 1) // BLOCK_N, lo), hi)
        m, l, acc = _walk(b_q, pos, row_ok, lo, full, hi, -1, seq_row, kv_head, k, v, L, S, scale, 0,
                          stride_ks, stride_kh, stride_vs, stride_vh, False, D, BLOCK_N, ROWS, DOT_IN_FP32, SUM_BY_DOT, PAIRED, 0, False)
        rows = tl.arange(0, ROWS)
        keep = rows < G
        at = ((i.to(tl.int64) * tl.num_programs(1) + kv_head) * NSPAN + c) * G_PAD + rows
        tl.store(ms + at, m, mask=keep)
        tl.store(ls + at, l, mask=keep)
        tl.store(accs + at[:, None] * D + tl.arange(0, D)[None, :], acc, mask=keep[:, None])


@jit
def _combine_span(m_t, l_t, acc_t, ms, ls, accs, at, keep, o_d, D: tl.constexpr, INTERPRETED: tl.constexpr):
    """One stored span state (rows `at`, columns o_d) combined into the total by the walk's `_combine`."""
    m = tl.load(ms + at, mask=keep, other=float("-inf"))
    l = tl.load(ls + at, mask=keep, other=0.0)
    acc = tl.load(accs + at[:, None] * D + o_d[None, :], mask=keep[:, None], other=0.0)
    return _combine(m_t, l_t, acc_t, m, l, acc, INTERPRETED)


@jit(do_not_specialize=["L"], dependent=True)
def combine_kernel(
    o, positions, ms, ls, accs, L, stride_ot, stride_oh,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PART: tl.constexpr, BLOCK_N: tl.constexpr, SPAN: tl.constexpr,
    NSPAN: tl.constexpr, INTERPRETED: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (query i, KV head, c): the row's span states combined in ascending order over acc's columns
    [c * D_PART, (c + 1) * D_PART), then the walk's zero select and division. Each element of acc is its own chain,
    so splitting the columns over programs leaves every one's order; m and l are recomputed by each."""
    after_upstream(PDL)
    i, kv_head = tl.program_id(0), tl.program_id(1)
    hi_key = tl.minimum(tl.load(positions + i).to(tl.int32), L - 1)
    spans = tl.cdiv(tl.where(hi_key >= 0, hi_key // BLOCK_N + 1, 0), SPAN)
    rows = tl.arange(0, G_PAD)
    o_d = tl.program_id(2) * D_PART + tl.arange(0, D_PART)
    keep = rows < G
    base = (i.to(tl.int64) * tl.num_programs(1) + kv_head) * NSPAN
    m_t = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_t = tl.zeros([G_PAD], dtype=tl.float32)
    acc_t = tl.zeros([G_PAD, D_PART], dtype=tl.float32)
    if INTERPRETED:  # the interpreter cannot take a loaded bound in `range`
        c = 0
        while c < spans:
            m_t, l_t, acc_t = _combine_span(m_t, l_t, acc_t, ms, ls, accs, (base + c) * G_PAD + rows, keep, o_d, D, INTERPRETED)
            c += 1
    else:  # the loads do not wait on the combine: STAGES spans' states in flight
        for c in tl.range(0, spans, num_stages=STAGES):
            m_t, l_t, acc_t = _combine_span(m_t, l_t, acc_t, ms, ls, accs, (base + c) * G_PAD + rows, keep, o_d, D, INTERPRETED)
    _, out = _finish(l_t, acc_t)
    head = kv_head * G + rows
    tl.store(o + i.to(tl.int64) * stride_ot + head[:, None] * stride_oh + o_d[None, :], out.to(o.dtype.element_ty), mask=keep[:, None])


def attention_decode(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor, scale: float,
                     o: Tensor, block_m: int, block_n: int, num_warps: int, num_stages: int, span: int) -> Tensor:
    """`attention_fwd`'s decode rows (no window, no log-sum-exp) over spans of `span` key blocks into `o`, by the two
    kernels above. The grid covers the table's spans, so a captured step serves any row up to the table's length. A span
    program walks pairs of blocks (`_full_block_pair`) where a span holds an even number of blocks."""
    num_tokens, _, head_dim = q.shape
    num_kv_heads = k_store.shape[1]
    group, g_pad, rows = decode_tile(q, k_store, block_m)
    table = slot_table.shape[1]
    nspan = cdiv(cdiv(table, block_n), span)
    ms = q.new_empty((num_tokens, num_kv_heads, nspan, g_pad), dtype=torch.float32)
    ls = torch.empty_like(ms)
    accs = q.new_empty((num_tokens, num_kv_heads, nspan, g_pad, head_dim), dtype=torch.float32)
    interpret = triton_support.interpreting()
    span_kernel[(num_tokens, num_kv_heads, nspan)](
        q, k_store, v_store, slot_table, seq_ids, positions, ms, ls, accs, table, k_store.shape[0], float(scale),
        q.stride(0), q.stride(1), k_store.stride(0), k_store.stride(1), v_store.stride(0), v_store.stride(1), slot_table.stride(0),
        G=group, G_PAD=g_pad, D=head_dim, DOT_IN_FP32=interpret, SUM_BY_DOT=q.dtype == torch.float32 and not interpret,
        BLOCK_N=block_n, ROWS=rows, SPAN=span, NSPAN=nspan, PAIRED=span % 2 == 0, num_warps=num_warps, num_stages=num_stages)
    d_part = max(1, head_dim // COMBINE_SPLIT)
    combine_kernel[(num_tokens, num_kv_heads, head_dim // d_part)](
        o, positions, ms, ls, accs, table, o.stride(0), o.stride(1), G=group, G_PAD=g_pad, D=head_dim, D_PART=d_part,
        BLOCK_N=block_n, SPAN=span, NSPAN=nspan, INTERPRETED=interpret, STAGES=COMBINE_STAGES, num_warps=COMBINE_WARPS)
    return o
