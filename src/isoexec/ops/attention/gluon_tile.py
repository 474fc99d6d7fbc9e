"""attention.triton's tile on Hopper, written in Gluon.

Compiled by Triton, `attention_fwd_kernel`'s walk issues a key block's QK wgmma and waits for it, runs the softmax,
issues the PV wgmma and waits for it, then folds, and prefill runs at 0.60-0.65 of flash (benchmarks/RESULTS.md).
Gluon (`triton.experimental.gluon`: Triton's own back end with the layouts, shared buffers and wgmma waits written out)
runs the same walk by hand. Two block loops (`OVERLAP`): the walk's own order, and one that issues block j's QK together
with block j - 1's PV, runs block j's softmax while that PV is in flight and folds block j - 1 after it (only when each
wgmma is waited moves: the folds of l and acc stay in block order). On an H100 the overlap cost more than it gave, and
the walk's order written in Gluon as one 64-row tile ran faster than Triton's code for it (docs/experiments.md, "The spread
decode and the Gluon tile"), so that order is the default and the tile runs lone (`attention_fwd` stacks none for it).

The bits are the walk's by construction, not by test alone: the same tile (BLOCK_Q positions x the G_PAD query heads
of one KV head, `_tile`'s rows, tiles found among a program's queries by `attention_fwd_kernel`'s rule), the same
blocks in the same order (`_full_block` where every row sees the whole block, `_block` with its per-row masks and
selects after), per block the operations of `triton_steps.py` in the layouts Triton gives them there (read off the
TTGIR of `attention_fwd_kernel` for sm_90a): the scores in a wgmma accumulator of instruction [16, BLOCK_N, 16] over
[warps, 1], p · V in [16, D, 16], p as that product's register operand (k_width 2), the row reductions on the scores'
layout, p · V a separate sum (`settled`), the same zero select and division at the end. Keys no row of the tile sees
are gathered as +0.0, as `_block` gathers them. The GPU tests compare every output bit with the Triton walk's in
every form (tests/ops/attention/test_gluon_tile.py).

It serves the calls `attention_fwd` runs as tiles of 64 or 128 rows (one or two warpgroups: the many-query tiles and a
decode batch's tile of one query) with 16-bit operands, head_dim 128 and no window on a Hopper GPU, where
`ISOEXEC_ATTENTION_GLUON=1`. Off by default: on an H200 both loops gave the walk's bits and ran slower than Triton's walk
in prefill (the walk's order 0.82-0.99x; `benchmarks/attention_gluon.py`). No interpreter runs Gluon, so off a GPU only
its compilation for sm_90a is tested.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...env import switch
from ..triton_support import EX2_FTZ_F32, LOG2E, MUL_RN_F32

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
except ImportError:  # no Triton, or one without Gluon (before 3.5)
    gluon = None

STAGES = 3  # key blocks whose K and V are in flight or waiting: the walk's num_stages (a constexpr in the kernels below)


ENABLED: bool = switch("ISOEXEC_ATTENTION_GLUON", False)
# The block loop's order. False: the walk's own, each wgmma waited at once (softmax between the two MMAs), in lone
# 64-row tiles (`attention_fwd` stacks none while the tile is on). True: block j's QK issued with block j - 1's PV and
# block j's softmax run while that PV is in flight. On an H100 the overlap ran 0.83-0.85x the walk's order at 4 warps
# (docs/experiments.md, "The spread decode and the Gluon tile"); both give the walk's bits.
OVERLAP = False


def available() -> bool:
    return gluon is not None


def applies(rows: int, num_warps: int, head_dim: int, window: int | None, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `attention_fwd`'s call with this tile takes the Gluon kernel."""
    return (ENABLED and gluon is not None and rows == 16 * num_warps and num_warps in (4, 8) and head_dim == 128 and window is None
            and dtype in (torch.bfloat16, torch.float16) and _hopper(device))


@functools.cache
def _hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


if gluon is not None:
    _STAGES = gl.constexpr(STAGES)

    @gluon.constexpr_function
    def _rows_layout(warps):
        """Rows of D 16-bit elements as 16-byte pieces over the warps: how q is read and K and V rows gathered."""
        return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[warps, 1], order=[1, 0])

    @gluon.jit
    def _settled(x):
        """x as an opaque register copy (`triton_support.settled`): no add after it folds into the wgmma that made it."""
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def _issue(j, hi, k_bufs, v_bufs, k, v, seq_row, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh):
        """cp.async of key block j's K and V rows through the slot table into ring buffer j % BUFFERS, keys no row sees
        (past hi, the tile's last visible key) or outside the store as +0.0 (`_gather_kv`'s masks in `_block` and
        `_full_block`); one commit group a block, empty or not."""
        BUFFERS: gl.constexpr = k_bufs.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.shape[1]
        D: gl.constexpr = k_bufs.shape[2]
        LOAD: gl.constexpr = _rows_layout(gl.num_warps())
        keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LOAD))
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
        slots = gl.load(seq_row + keys, mask=keys < L, other=-1).to(gl.int64)
        keep = (keys <= hi) & (slots >= 0) & (slots < S)
        stage = j % BUFFERS
        async_copy.async_copy_global_to_shared(k_bufs.index(stage), k + slots[:, None] * stride_ks + kv_head * stride_kh + o_d[None, :],
                                               mask=keep[:, None])
        async_copy.async_copy_global_to_shared(v_bufs.index(stage), v + slots[:, None] * stride_vs + kv_head * stride_vh + o_d[None, :],
                                               mask=keep[:, None])
        async_copy.commit_group()

    @gluon.jit
    def _landed(OUTSTANDING: gl.constexpr):
        """At most OUTSTANDING blocks' copies still in flight; every thread's copies visible to the wgmmas (the async
        proxy) and to the other warps."""
        async_copy.wait_group(OUTSTANDING)
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def _exp_ftz(x):
        """triton_support.exp_ftz."""
        return gl.inline_asm_elementwise(EX2_FTZ_F32, "=r,r", [x * LOG2E], dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def _softmax(s, m, l, j, pos, row_ok, seq_row, L, S, scale, MASKED: gl.constexpr, BLOCK_N: gl.constexpr):
        """Block j's step up to p · V (`_update`'s scores, running max, p and l; with MASKED, `_visible`'s masks and
        `_block`'s selects of m and l): the new m and l, alpha, p (fp32) and which rows see a key of the block."""
        keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
        slots = gl.load(seq_row + keys, mask=keys < L, other=-1)
        ok = (slots >= 0) & (slots < S)
        s = gl.inline_asm_elementwise(MUL_RN_F32, "=r,r,r", [s, scale], dtype=gl.float32, is_pure=True, pack=1)  # `rounded_mul`
        if MASKED:
            vis = (keys[None, :] <= pos[:, None]) & (keys[None, :] < L) & row_ok[:, None] & ok[None, :]
            s = gl.where(vis, s, float("-inf"))
            active = gl.max(vis.to(gl.int32), 1) > 0
        else:
            s = gl.where(ok[None, :], s, float("-inf"))
            active = pos >= -1  # every row: `_full_block` selects nothing
        m_new = gl.maximum(m, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = _exp_ftz(m - m_safe)
        p = _exp_ftz(s - m_safe[:, None])
        l_new = l * alpha + gl.sum(p, 1)
        if MASKED:
            m_new = gl.where(active, m_new, m)
            l_new = gl.where(active, l_new, l)
        return m_new, l_new, alpha, p, active

    @gluon.jit
    def _fold(acc, alpha, pv, active, MASKED: gl.constexpr):
        """acc · alpha + p · V (`_fold_sums`); with MASKED only for the rows that saw a key of the block."""
        rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        acc_new = acc * gl.convert_layout(alpha, rows)[:, None] + _settled(pv)
        if MASKED:
            acc_new = gl.where(gl.convert_layout(active, rows)[:, None], acc_new, acc)
        return acc_new

    @gluon.jit
    def _fold_block(acc, alpha, pv, active, j, full_blk):
        """`_fold` of block j, masked where the walk masks it (from full_blk on)."""
        if j < full_blk:
            acc = _fold(acc, alpha, pv, active, False)
        else:
            acc = _fold(acc, alpha, pv, active, True)
        return acc

    @gluon.jit
    def _tile(i, q, o, lse, k, v, slot_table, seq_ids, positions, kv_head, q_smem, k_bufs, v_bufs, T, L, S, scale,
              stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_sb, stride_lh,
              G: gl.constexpr, G_PAD: gl.constexpr, BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr, WITH_LSE: gl.constexpr,
              OVERLAP: gl.constexpr):
        """`_tile` for the tile that starts at query i: its rows, every key block they see, their outputs."""
        ROWS: gl.constexpr = q_smem.shape[0]
        D: gl.constexpr = q_smem.shape[1]
        WARPS: gl.constexpr = gl.num_warps()
        S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_N, 16])
        O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16])
        P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
        LOAD: gl.constexpr = _rows_layout(WARPS)
        BUFFERS: gl.constexpr = k_bufs.shape[0]

        # `_tile`'s rows: row r is query i + r // G_PAD (while the run of consecutive positions of one sequence inside
        # one absolute block of BLOCK_Q positions lasts) for query head kv_head * G + r % G_PAD
        seq = gl.load(seq_ids + i)
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
        t = rows // G_PAD
        tok = i + t
        in_range = tok < T
        s_tok = gl.load(seq_ids + tok, mask=in_range, other=-1)
        p_tok = gl.load(positions + tok, mask=in_range, other=-1)
        pos_prev = gl.load(positions + tok - 1, mask=in_range & (t > 0), other=-1)
        cut = (t > 0) & (~in_range | (s_tok != seq) | (pos_prev + 1 != p_tok) | (p_tok % BLOCK_Q == 0))
        length = gl.min(gl.where(cut, t, BLOCK_Q), 0)
        row_ok = (t < length) & (rows < BLOCK_Q * G_PAD) & (rows % G_PAD < G)
        head = kv_head * G + rows % G_PAD
        tok = gl.where(row_ok, tok, i).to(gl.int64)
        pos = gl.where(row_ok, p_tok, -1).to(gl.int32)
        hi = gl.max(gl.where(row_ok, gl.minimum(pos, L - 1), -1), 0)
        hi_blk = gl.where(hi >= 0, hi // BLOCK_N + 1, 0)
        full_blk = (gl.minimum(gl.load(positions + i), L - 1).to(gl.int32) + 1) // BLOCK_N
        seq_row = slot_table + seq.to(gl.int64) * stride_sb

        # the last tile's wgmmas and copies are done in every warp before its buffers take this tile's
        gl.thread_barrier()
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
        q_rows = q + gl.convert_layout(tok, gl.SliceLayout(1, LOAD)) * stride_qt + gl.convert_layout(head, gl.SliceLayout(1, LOAD)) * stride_qh
        q_smem.store(gl.load(q_rows[:, None] + o_d[None, :], mask=gl.convert_layout(row_ok, gl.SliceLayout(1, LOAD))[:, None], other=0.0))
        for b in gl.static_range(_STAGES - 1):
            _issue(b, hi, k_bufs, v_bufs, k, v, seq_row, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)

        m = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
        l = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
        acc = gl.zeros([ROWS, D], gl.float32, layout=O_LAYOUT)
        zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=S_LAYOUT)
        zero_o = gl.zeros([ROWS, D], gl.float32, layout=O_LAYOUT)
        if OVERLAP:
            # Block 0 by the masked step, which gives the unmasked step's values for a whole block; a tile that sees no
            # key (hi_blk = 0) gathers zeros and keeps every row's state there.
            _landed(_STAGES - 2)
            _issue(_STAGES - 1, hi, k_bufs, v_bufs, k, v, seq_row, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)
            s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False)
            m, l, alpha_prev, p, active_prev = _softmax(s, m, l, 0, pos, row_ok, seq_row, L, S, scale, True, BLOCK_N)
            p_prev = gl.convert_layout(p.to(q_smem.dtype), P_LAYOUT)
            for j in range(1, hi_blk):
                _landed(_STAGES - 2)
                # into block j - 2's buffer: its PV was waited in the last iteration, before this barrier
                _issue(j + _STAGES - 1, hi, k_bufs, v_bufs, k, v, seq_row, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)
                s_mma = warpgroup_mma(q_smem, k_bufs.index(j % BUFFERS).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                pv_mma = warpgroup_mma(p_prev, v_bufs.index((j - 1) % BUFFERS), zero_o, use_acc=False, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s_mma, ))
                if j < full_blk:
                    m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, seq_row, L, S, scale, False, BLOCK_N)
                else:
                    m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, seq_row, L, S, scale, True, BLOCK_N)
                pv, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(pv_mma, p_prev))
                acc = _fold_block(acc, alpha_prev, pv, active_prev, j - 1, full_blk)
                p_prev, alpha_prev, active_prev = gl.convert_layout(p.to(q_smem.dtype), P_LAYOUT), alpha, active
            last = gl.maximum(hi_blk - 1, 0)
            pv = warpgroup_mma(p_prev, v_bufs.index(last % BUFFERS), zero_o, use_acc=False)
            acc = _fold_block(acc, alpha_prev, pv, active_prev, last, full_blk)
        else:
            # The walk's order: block j's QK waited, its softmax, its PV waited, its fold. A tile that sees no key
            # (hi_blk = 0) runs no block and keeps every row's state.
            for j in range(hi_blk):
                _landed(_STAGES - 2)
                # into block j - 1's buffer: its wgmmas were waited before this barrier
                _issue(j + _STAGES - 1, hi, k_bufs, v_bufs, k, v, seq_row, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)
                s = warpgroup_mma(q_smem, k_bufs.index(j % BUFFERS).permute((1, 0)), zero_s, use_acc=False)
                if j < full_blk:
                    m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, seq_row, L, S, scale, False, BLOCK_N)
                else:
                    m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, seq_row, L, S, scale, True, BLOCK_N)
                pv = warpgroup_mma(gl.convert_layout(p.to(q_smem.dtype), P_LAYOUT), v_bufs.index(j % BUFFERS), zero_o, use_acc=False)
                acc = _fold_block(acc, alpha, pv, active, j, full_blk)
        async_copy.wait_group(0)

        # `_finish`: 0 for a row that saw no key, a zero acc taken as +0.0
        o_rows: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
        has_keys = l > 0.0
        acc = gl.where(acc == 0.0, 0.0, acc)
        out = gl.where(gl.convert_layout(has_keys, o_rows)[:, None], acc / gl.convert_layout(gl.where(has_keys, l, 1.0), o_rows)[:, None], 0.0)
        d_o = gl.arange(0, D, layout=gl.SliceLayout(0, O_LAYOUT))
        p_o = o + gl.convert_layout(tok, o_rows) * stride_ot + gl.convert_layout(head, o_rows) * stride_oh
        gl.store(p_o[:, None] + d_o[None, :], out.to(o.dtype.element_ty), mask=gl.convert_layout(row_ok, o_rows)[:, None])
        if WITH_LSE:  # flash's convention, as `_tile` writes it
            row_lse = gl.where(has_keys, m + gl.log(gl.where(has_keys, l, 1.0)), float("inf"))
            gl.store(lse + head.to(gl.int64) * stride_lh + tok, row_lse, mask=row_ok)

    @gluon.jit(do_not_specialize=["T", "L", "S"])
    def gluon_fwd_kernel(q, k, v, o, lse, slot_table, seq_ids, positions, T, L, S, scale,
                         stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_sb, stride_lh,
                         G: gl.constexpr, G_PAD: gl.constexpr, D: gl.constexpr, BLOCK_Q: gl.constexpr, BLOCK_N: gl.constexpr,
                         QUERIES: gl.constexpr, WITH_LSE: gl.constexpr, OVERLAP: gl.constexpr):
        """`attention_fwd_kernel`: program (r, kv_head) runs the tiles that start among queries [r * QUERIES, (r + 1) *
        QUERIES), last queries first (QUERIES = BLOCK_Q for many queries, 1 for a decode batch)."""
        WARPS: gl.constexpr = gl.num_warps()
        SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        ONE_D: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[WARPS], order=[0])
        DT: gl.constexpr = q.dtype.element_ty
        # overlapped, one buffer more than the loads in flight: block j - 1's V is read by its PV while block j's softmax
        # runs; in the walk's order block j - 1's wgmmas are done before block j + STAGES - 1's copy takes its buffer
        BUFFERS: gl.constexpr = _STAGES + 1 if OVERLAP else _STAGES
        q_smem = gl.allocate_shared_memory(DT, [16 * WARPS, D], SMEM)
        k_bufs = gl.allocate_shared_memory(DT, [BUFFERS, BLOCK_N, D], SMEM)
        v_bufs = gl.allocate_shared_memory(DT, [BUFFERS, BLOCK_N, D], SMEM)

        r = gl.num_programs(0) - 1 - gl.program_id(0)
        kv_head = gl.program_id(1)
        c = gl.arange(0, QUERIES, layout=ONE_D)
        cand = r * QUERIES + c
        valid = cand < T
        has_prev = valid & (cand > 0)
        seq_c = gl.load(seq_ids + cand, mask=valid, other=-1)
        pos_c = gl.load(positions + cand, mask=valid, other=-1)
        seq_p = gl.load(seq_ids + cand - 1, mask=has_prev, other=-1)
        pos_p = gl.load(positions + cand - 1, mask=has_prev, other=-1)
        starts = valid & ((cand == 0) | (seq_p != seq_c) | (pos_p + 1 != pos_c) | (pos_c % BLOCK_Q == 0))
        start = gl.min(gl.where(starts, c, QUERIES), 0)
        while start < QUERIES:
            _tile(r * QUERIES + start, q, o, lse, k, v, slot_table, seq_ids, positions, kv_head, q_smem, k_bufs, v_bufs, T, L, S, scale,
                  stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_sb, stride_lh,
                  G, G_PAD, BLOCK_Q, BLOCK_N, WITH_LSE, OVERLAP)
            start = gl.min(gl.where(starts & (c > start), c, QUERIES), 0)


def attention_fwd(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor, scale: float,
                  o: Tensor, lse: Tensor | None, group: int, g_pad: int, tile_positions: int, queries: int, block_n: int,
                  num_warps: int, overlap: bool | None = None, maxnreg: int | None = None) -> Tensor:
    """`attention_fwd`'s call into `o` (and `lse`) by the Gluon kernel, with the tile and queries a program as
    `attention_fwd` chose them; `overlap` the block loop's order (None: `OVERLAP`); `maxnreg` a cap on the registers a
    thread (ptxas's; None: its own choice), for the probe (`benchmarks/attention_gluon.py`)."""
    num_tokens = q.shape[0]
    gluon_fwd_kernel[(-(-num_tokens // queries), k_store.shape[1])](
        q, k_store, v_store, o, o if lse is None else lse, slot_table, seq_ids, positions,
        num_tokens, slot_table.shape[1], k_store.shape[0], float(scale),
        q.stride(0), q.stride(1), k_store.stride(0), k_store.stride(1), v_store.stride(0), v_store.stride(1), o.stride(0), o.stride(1),
        slot_table.stride(0), 0 if lse is None else lse.stride(0),
        G=group, G_PAD=g_pad, D=q.shape[2], BLOCK_Q=tile_positions, BLOCK_N=block_n, QUERIES=queries, WITH_LSE=lse is not None,
        OVERLAP=OVERLAP if overlap is None else overlap, num_warps=num_warps, **({} if maxnreg is None else {"maxnreg": maxnreg}))
    return o
