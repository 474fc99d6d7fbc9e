"""`triton_blocks.py`'s three launches as one: the same values, the launch gaps and a program prologue fewer.

A program of the one kernel does, for its run of a row's key blocks, what a program of each of the three kernels
does, and waits where those launches waited:

1. its run's scores and their row maxima, kept in registers as the run's maximum, which it publishes (a store, then a
   flag set with release semantics);
2. the walk's m before its run: the maximum of the runs before it in the row, each read once its flag is set
   (acquire); then its blocks' alpha, sum_j p and p · v along the run, stored, by `triton_blocks._run_terms`;
3. it counts itself done for the row; the row's last program to finish folds the row's blocks in ascending order and
   divides (`triton_blocks._fold_row`, every column in the one program).

Waiting on another program inside a kernel is safe only for programs that have started: a program takes its place
in the row (the run c of P) from a ticket, an atomic counter drawn when it starts, so every run it waits for belongs
to a program that started earlier and waits on no later one. The counter, the flags and the row counts are zeroed
for each call (one `torch.zeros`).

Nothing here changes an operand or an order: step 1 computes each block's scores by the walk's helpers (a maximum is
exact in any order), step 2 is the terms kernel's run (`_run_terms`), step 3 the fold kernel's loop.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import triton_support
from ..triton_support import after_upstream, cdiv, jit, next_power_of_2, tl
from . import triton_blocks
from .triton_blocks import _block_scores, _decode_rows, _fold_row, _program, _row_blocks, _run_terms


@jit
def _wait(flag):
    """Spin until `flag` (an int32 set once, with release semantics) is set; its writer's stores are then seen."""
    while tl.atomic_add(flag, 0, sem="acquire") == 0:
        pass


@jit(do_not_specialize=["L", "S", "P"], dependent=True)
def spread_decode_kernel(
    q, k, v, slot_table, seq_ids, positions, o, sync, run_max, alphas, sums, pvs, L, S, scale, P,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_sb, stride_ot, stride_oh,
    H: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, NB: tl.constexpr, INTERPRETED: tl.constexpr, STAGES: tl.constexpr,
    FOLD_STAGES: tl.constexpr, UNROLL: tl.constexpr, PDL: tl.constexpr = False,
):
    """Ticket t: query i, KV head h, run c of P (t = (i * H + h) * P + c). `sync` holds the ticket counter, then a
    flag per (i, h, c), then a count of finished programs per (i, h)."""
    after_upstream(PDL)
    t = tl.atomic_add(sync, 1, sem="relaxed")
    row = t // P
    c = t % P
    i, kv_head = row // H, row % H
    flags = sync + 1 + row * P
    done = sync + 1 + tl.num_programs(0) + row
    p_i, seq_row, full_blk, lo, hi = _program(i, c, P, seq_ids, positions, slot_table, L, stride_sb, BLOCK_N)
    b_q, row_ok = _decode_rows(q, i, kv_head, stride_qt, stride_qh, G, G_PAD, D, ROWS, DOT_IN_FP32)
    head_base = row.to(tl.int64) * NB
    rows = tl.arange(0, ROWS)
    o_g = tl.arange(0, G_PAD)
    # 1. The run's maximum ([ROWS]; -inf for a run of no blocks), published.
    m_run = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    i_blk = lo
    while i_blk < hi:
        s, _, _ = _block_scores(b_q, row_ok, p_i, i_blk, i_blk < full_blk, seq_row, kv_head, k, v, L, S, scale,
                                stride_ks, stride_kh, stride_vs, stride_vh, ROWS, D, BLOCK_N, DOT_IN_FP32)
        m_run = tl.maximum(m_run, tl.max(s, 1))
        i_blk += 1
    tl.store(run_max + t * G_PAD + rows, m_run, mask=rows < G_PAD)
    tl.debug_barrier()  # every thread's store before the flag
    tl.atomic_xchg(flags + c, 1, sem="release")
    # 2. m before the run: the earlier runs' maxima, each once published; then the run's terms.
    m_g = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    before = 0
    while before < c:
        _wait(flags + before)
        tl.debug_barrier()
        m_g = tl.maximum(m_g, tl.load(run_max + (t - c + before) * G_PAD + o_g))
        before += 1
    _run_terms(m_g, lo, hi, b_q, row_ok, p_i, full_blk, seq_row, kv_head, k, v, alphas, sums, pvs, head_base, L, S, scale,
               stride_ks, stride_kh, stride_vs, stride_vh, G, G_PAD, ROWS, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT, INTERPRETED, STAGES)
    # 3. The row's last program to finish folds it.
    tl.debug_barrier()  # every thread's terms before the count
    if tl.atomic_add(done, 1, sem="acq_rel") == P - 1:
        tl.debug_barrier()
        _fold_row(o, i, kv_head, _row_blocks(p_i, L, BLOCK_N), head_base, alphas, sums, pvs, stride_ot, stride_oh, 0, G, G_PAD, D, D,
                  INTERPRETED, FOLD_STAGES, UNROLL)


def attention_decode(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor, scale: float,
                     o: Tensor, block_m: int, block_n: int, num_warps: int, num_stages: int) -> Tensor:
    """`triton_blocks.attention_decode`'s rows into `o`, in one launch."""
    num_tokens, _, head_dim = q.shape
    num_kv_heads = k_store.shape[1]
    group, g_pad, rows = triton_blocks.decode_tile(q, k_store, block_m)
    table = slot_table.shape[1]
    nb = next_power_of_2(cdiv(table, block_n))
    runs = triton_blocks._programs_a_row(num_tokens * num_kv_heads, cdiv(table, block_n), q.device, triton_blocks.PROGRAM_WAVES)
    programs = num_tokens * num_kv_heads * runs
    sync = torch.zeros(1 + programs + num_tokens * num_kv_heads, dtype=torch.int32, device=q.device)
    run_max = q.new_empty((programs, g_pad), dtype=torch.float32)
    alphas = q.new_empty((num_tokens, num_kv_heads, nb, g_pad), dtype=torch.float32)
    sums = torch.empty_like(alphas)
    pvs = q.new_empty((num_tokens, num_kv_heads, nb, g_pad, head_dim), dtype=torch.float32)
    interpret = triton_support.interpreting()
    spread_decode_kernel[(programs,)](
        q, k_store, v_store, slot_table, seq_ids, positions, o, sync, run_max, alphas, sums, pvs, table, k_store.shape[0], float(scale),
        runs, q.stride(0), q.stride(1), k_store.stride(0), k_store.stride(1), v_store.stride(0), v_store.stride(1), slot_table.stride(0),
        o.stride(0), o.stride(1), H=num_kv_heads, G=group, G_PAD=g_pad, D=head_dim, DOT_IN_FP32=interpret,
        SUM_BY_DOT=q.dtype == torch.float32 and not interpret, BLOCK_N=block_n, ROWS=rows, NB=nb, INTERPRETED=interpret,
        STAGES=triton_blocks.BLOCK_STAGES, FOLD_STAGES=triton_blocks.FOLD_STAGES, UNROLL=triton_blocks.FOLD_UNROLL,
        num_warps=num_warps, num_stages=num_stages)
    return o
