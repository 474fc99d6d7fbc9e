"""gdn.core by chunk-form rows as one Triton kernel: every row from its absolute chunk's start state and the
chunk's inputs up to itself, by one op sequence in training, prefill chunks and decode (README.md).

One program per (run, value head) walks its run chunk piece by chunk piece, serially (the state chain),
one block of BV value columns after the other (a decode call with few programs gives each block a program of its
own: `SPLITS` below); the work inside a chunk is a handful of C-row tensor-core products, as
flash-linear-attention's chunk kernels do it. Every tile has C rows with row r at chunk offset r whatever
the piece computes: a piece that starts mid-chunk (an engine call continuing its sequence) loads the
chunk's earlier inputs from the sequence's cache slot and recomputes those rows exactly as the first call
did, so a decode step runs the trainer's tiles with the rows past it zero. The engine's cache is
therefore the open chunk's *inputs* (k and v as given, g and β as this kernel gated them) and the fp32
state at its start: no intermediate a later call would have to reproduce; under the constant `inverse = "rows"` also
T's rows, which a later call reads and never recomputes (`triton_tiles._inverse_rows`). A piece that leaves its chunk
open writes its rows into the slot itself, the fields every value block reads (k, g, β) from the last
block, after every block has read the slot's earlier rows: one launch a call.

The tiles a chunk piece computes, and why a row's bits do not depend on the rows after it, are in
`triton_tiles.py`. A call whose runs are long can instead run in two launches (`triton_two_launch.py`, the path
choice below) with the same bits.

Each kernel compiles once for every case: nothing that differs between a trainer call and an engine call
is a constexpr or a specialised integer (has_cache, T and the strides are runtime values; the wrapper
hands the kernels 16-byte aligned pointers and strides that are multiples of 16 elements only), because
two compiled variants may lay a tile out differently and reduce it in another order (which is why the
two-launch path's layouts were read, and its bits are tested, rather than assumed). The split decode's blocks
(`SPLITS`) are such variants too, their block of columns a constexpr (a 32-column block also orders its piece's loads
otherwise, `_piece`, and computes a one-token run by straight-line code, `_token`): their bits are tested against the
unsplit kernel's, on the CPU and on a GPU. The backward pass
(`triton_bwd.py`) is Triton kernels of its own: correct gradients, not invariant ones.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from ...env import EnvError
from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, torch_dtype
from ..triton_support import jit, needs_grad, require_device, tl, triton_available
from . import triton_tiles, triton_two_launch
from .reference import check_inputs, check_runs
from .runs import Runs, find_runs
from .triton_bwd import gdn_bwd
from .triton_tiles import (INVERSES, PRECISIONS, SUB, T_FIELD, _advanced, _decayed, _delta, _gates_of, _in_dtype, _key_chain, _key_loads, _operand,
                           _outputs, _padded, _piece_keys, _piece_queries, _piece_values, _queries, _query_inputs, _rows_mask, _strided16,
                           _values, row_floats)

ID = "gdn.core.triton"
VERSION = 3
DTYPES = ("bfloat16", "float32")


def row_width(num_v_heads: int, k_dim: int, v_dim: int, constants: dict) -> int:
    """Floats a cached open-chunk row holds per value head under the entry's `constants`: the inputs k and v as given
    (in [Dk_pad] and [Dv_pad] fields), then g and β, padded to 16 floats, then T's row under `inverse = "rows"` alone
    (`triton_tiles.row_floats`): every field starts 64-byte aligned."""
    return row_floats(_padded(k_dim), _padded(v_dim), bool(INVERSES[constants.get("inverse", "products")]))

# T, has_cache and the strides are not specialised: one compiled kernel serves every case (the module doc). Not a
# dependent launch (PDL), unlike the conv ahead of it: on an H100, 16 decode steps in a CUDA graph took 8.92 µs a step at
# batch 1 with PDL and 8.69 without (9.57 / 9.39 at batch 2, 11.82 / 11.57 at 4; benchmarks/RESULTS.md).
@jit(do_not_specialize=["T", "has_cache", "every_token", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
                        "stride_at", "stride_ot", "stride_oh"])
def gdn_fwd_kernel(
    q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, candidates,
    T, q_scale, has_cache, every_token,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, ROWS: tl.constexpr, INTERPRET: tl.constexpr,
    SPLIT: tl.constexpr,
):
    # Program (p, h, s): if a run starts at token p (every_token: while a CUDA graph is captured) or candidates[p]
    # (a new slot, or a position that does not follow the previous token's), walk that run for value head h,
    # one block of value columns after the other; or, where the grid splits the value columns (SPLIT: s over the
    # blocks, `SPLITS` below) and the run is one token, block s of that token's row alone.
    NV: tl.constexpr = (DV + BV - 1) // BV
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_t = tl.load(candidates + i_c, mask=every_token == 0, other=0)
    i_t = tl.where(every_token != 0, i_c, i_t)
    pos0 = tl.load(positions + i_t)
    prev_pos = tl.load(positions + i_t - 1, mask=i_t > 0, other=-2)
    starts = (i_t == 0) | (prev_pos + 1 != pos0)
    caching = has_cache != 0
    slot = tl.load(state_ids + i_t, mask=caching, other=0).to(tl.int64)
    starts = starts | (caching & (tl.load(state_ids + i_t - 1, mask=caching & (i_t > 0), other=-1) != slot))
    if SPLIT:
        # A run of one token writes its slot's row at its own offset and reads the rows before it, so the programs
        # of its value blocks never touch a row another writes; a longer run may close a chunk and write the next
        # chunk's first rows, which another block's program may not have read yet: one program walks it, block by
        # block.
        i_s = tl.program_id(2)
        after = tl.load(positions + i_t + 1, mask=i_t + 1 < T, other=-2)
        alone = (i_t + 1 >= T) | (after != pos0 + 1)
        alone = alone | (caching & (tl.load(state_ids + i_t + 1, mask=caching & (i_t + 1 < T), other=-1) != slot))
        if BV <= 32:
            # A one-token run: block i_s of its row by straight-line code, every access masked by whether there is one, so
            # the compiler issues the piece's loads and lays out its tiles' addresses beside the loads above, not behind
            # a branch on them; its slot is the one read above (no second round trip for it). Blocks of 64 keep the
            # loop alone: beside it this copy spilled 408 bytes there (40 without).
            _token(q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, T, q_scale, i_t, i_h, i_s, i_s == NV - 1, starts & alone,
                   pos0, slot, caching, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot,
                   stride_oh, GROUP, HV, DK, DV, DK_PAD, DV_PAD, BV, C, SUB, PRECISION, ROWS, INTERPRET)
            i_v = 0
            end = tl.where(starts & ~alone & (i_s == 0), NV, 0)
        else:
            i_v = tl.where(alone, i_s, 0)
            end = tl.where(starts, tl.where(alone, i_s + 1, tl.where(i_s == 0, NV, 0)), 0)
        while i_v < end:  # not `for … in range(i_v, end)`: the interpreter cannot take loaded bounds there
            _run(q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, T, q_scale, i_t, i_h, i_v, i_v == NV - 1,
                 pos0, slot, caching, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
                 GROUP, HV, DK, DV, DK_PAD, DV_PAD, BV, C, SUB, PRECISION, ROWS, INTERPRET)
            i_v += 1
    elif starts:  # its own constexpr loop: the loop above, with runtime bounds, made this variant spill 88 bytes more
        for i_v in range(NV):
            _run(q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, T, q_scale, i_t, i_h, i_v, i_v == NV - 1,
                 pos0, slot, caching, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
                 GROUP, HV, DK, DV, DK_PAD, DV_PAD, BV, C, SUB, PRECISION, ROWS, INTERPRET)


@jit
def _run(
    q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, state_ids, positions, T, q_scale, i_t, i_h, i_v, last_block, pos0, slot,
    caching, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, ROWS: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Value head i_h, columns [i_v BV, (i_v + 1) BV) of the run that starts at token i_t, piece by piece."""
    width: tl.constexpr = DK_PAD + DV_PAD + 16 + (T_FIELD if ROWS else 0)  # triton_tiles.row_floats
    rows = tl.arange(0, C)
    o_k, o_v, m_k, m_v, m_state, i_kh, neg_a, bias, p_start = _block(a_log, dt_bias, state, slot, i_h, i_v, GROUP, HV, DK, DV, DK_PAD,
                                                                     BV)
    # The run's start state: the slot's open chunk's, or zeros at position 0 (this program's value columns); a program of
    # a narrow block (a decode step split over the value columns) reads it in its first piece, after the piece's inputs.
    if BV <= 32:
        s0 = tl.zeros([DK_PAD, BV], dtype=tl.float32)
    else:
        s0 = tl.load(p_start, mask=m_state & (pos0 > 0) & caching, other=0.0)  # [DK_PAD, BV]

    t = i_t.to(tl.int64)  # the token at offset `off` of the current piece
    pos = pos0
    going = pos0 >= 0
    closed = pos0 < 0  # whether a chunk closed in this call
    while going:
        off = pos % C
        # This piece: the run's tokens from offset `off` to the chunk's end or the run's end.
        tok = t + rows - off  # [C]
        # The piece's rows are loaded with the mask of every row it may hold (`loaded`), issued beside the loads that
        # find where it stops rather than after them.
        loaded = (rows >= off) & (tok < T)
        stop = _piece_stop(positions, state_ids, tok, pos, off, slot, caching, T, C)
        piece = (rows >= off) & (rows < stop)  # [C], within `loaded`
        cached = rows < off  # the chunk's earlier rows, from the slot (off > 0 only with a cache)
        # The slot as the piece's first token names it (the run's slot): read per piece, so the compiler does not hoist
        # the cache's [C, D] address tiles out of the loop and keep them live. Taking the slot loaded first for the run's
        # first piece instead (its cached rows a round trip sooner) timed the same at batch 1-16 on an H100.
        p_slot = rows_cache + tl.load(state_ids + t, mask=caching, other=0).to(tl.int64) * (C * HV * width) + i_h * width
        s0 = _piece(q, k, v, a, b, out, p_start, s0, p_slot, tok, loaded, piece, cached, stop, pos == pos0, pos0, caching, last_block,
                    i_h, i_kh, o_k, o_v, m_k, m_v, m_state, neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                    stride_vh, stride_at, stride_ot, stride_oh, 0.0, 0.0, HV, DK, DV, DK_PAD, DV_PAD, BV, C, SUB, PRECISION, ROWS, INTERPRET,
                    False)
        if stop == C:
            closed = pos0 >= 0
        t += stop - off
        pos += stop - off
        going = (stop == C) & (t < T)
        if going:
            going = tl.load(positions + t, mask=t < T, other=-1) == pos
            going = going & (~caching | (tl.load(state_ids + t, mask=caching & (t < T), other=-1) == slot))
    if caching & (closed | (pos0 == 0)):  # the state changed (a chunk closed), or the slot never held this sequence's
        p_state = state + tl.load(state_ids + i_t).to(tl.int64) * (HV * DK * DV) + i_h * (DK * DV)  # reread: see p_slot
        tl.store(p_state + o_k[:, None] * DV + o_v[None, :], s0, mask=m_state)


@jit
def _token(
    q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, T, q_scale, i_t, i_h, i_v, last_block, one, pos0, slot, caching,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at, stride_ot, stride_oh,
    GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, ROWS: tl.constexpr, INTERPRET: tl.constexpr,
):
    """`_run` for a run of one token (`one`; else nothing is read or written), value head i_h, columns
    [i_v BV, (i_v + 1) BV): the one piece that token's chunk offset ends, with no loop or branch ahead of its loads."""
    width: tl.constexpr = DK_PAD + DV_PAD + 16 + (T_FIELD if ROWS else 0)  # triton_tiles.row_floats
    rows = tl.arange(0, C)
    o_k, o_v, m_k, m_v, m_state, i_kh, neg_a, bias, p_start = _block(a_log, dt_bias, state, slot, i_h, i_v, GROUP, HV, DK, DV, DK_PAD,
                                                                     BV, False)
    active = one & (pos0 >= 0)
    off = pos0 % C
    stop = tl.where(active, off + 1, 0)
    tok = i_t.to(tl.int64) + rows - off
    loaded = (rows >= off) & (tok < T) & active
    piece = (rows >= off) & (rows < stop)
    cached = (rows < off) & active
    tl.static_assert(BV <= 32)  # so `_piece` reads the start state itself, after the piece's inputs
    s0 = tl.zeros([DK_PAD, BV], dtype=tl.float32)
    p_slot = rows_cache + slot * (C * HV * width) + i_h * width
    # The token's gate inputs as scalars (the program's token always exists), issued beside the run finding's loads. As
    # a row vector masked by the row's offset, Triton loaded them again for each layout the gates are used in, each load
    # right before its use: on an H100 a step over a chunk took 5.88 us at batch 1 against 6.66 (7.13 against 7.82 at
    # batch 2). Each pair (the token's a and b; the head's A_log and dt_bias) goes as one two-element load, its values
    # taken out by sums of one value and a zero (exact but for a zero's sign, which no later step reads): loaded one by
    # one, ptxas placed some where they are used, a wait of their own (6.96 against 7.05 us at batch 2, 5.72 against
    # 5.74 at batch 1). The same bits (docs/experiments.md, "The one-token program's gates as scalars" and "Gate loads
    # in pairs and tiles").
    pair = tl.arange(0, 2)
    ab = tl.load(tl.where(pair == 0, a, b) + (i_t.to(tl.int64) * stride_at + i_h)).to(tl.float32)
    a_tok, b_tok = tl.sum(tl.where(pair == 0, ab, 0.0), 0), tl.sum(tl.where(pair == 1, ab, 0.0), 0)
    consts = tl.load(tl.where(pair == 0, a_log, dt_bias) + i_h).to(tl.float32)
    neg_a, bias = -tl.exp(tl.sum(tl.where(pair == 0, consts, 0.0), 0)), tl.sum(tl.where(pair == 1, consts, 0.0), 0)
    s0 = _piece(q, k, v, a, b, out, p_start, s0, p_slot, tok, loaded, piece, cached, stop, active, pos0, caching, last_block, i_h,
                i_kh, o_k, o_v, m_k, m_v, m_state, neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                stride_at, stride_ot, stride_oh, a_tok, b_tok, HV, DK, DV, DK_PAD, DV_PAD, BV, C, SUB, PRECISION, ROWS, INTERPRET, True)
    if caching & one & ((stop == C) | (pos0 <= 0)):  # as `_run`'s last store
        tl.store(p_start, s0, mask=m_state)


@jit
def _block(a_log, dt_bias, state, slot, i_h, i_v, GROUP: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
           DK_PAD: tl.constexpr, BV: tl.constexpr, CONSTS: tl.constexpr = True):
    """A program's block, value head i_h's columns [i_v BV, (i_v + 1) BV): the key and value offsets and their masks,
    the state's mask, the key head, the head's gate constants -exp(A_log) and dt_bias (CONSTS; else zeros, the caller
    loads them), and the block's start state in the slot."""
    o_k, o_v = tl.arange(0, DK_PAD), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    m_state = m_k[:, None] & m_v[None, :]
    i_kh = i_h // GROUP
    neg_a, bias = 0.0, 0.0
    if CONSTS:
        neg_a = -tl.exp(tl.load(a_log + i_h).to(tl.float32))
        bias = tl.load(dt_bias + i_h).to(tl.float32)
    p_start = state + slot * (HV * DK * DV) + i_h * (DK * DV) + o_k[:, None] * DV + o_v[None, :]
    return o_k, o_v, m_k, m_v, m_state, i_kh, neg_a, bias, p_start


@jit
def _piece(q, k, v, a, b, out, p_start, s0, p_slot, tok, loaded, piece, cached, stop, first, pos0, caching, last_block, i_h, i_kh, o_k,
           o_v, m_k, m_v, m_state, neg_a, bias, q_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_at,
           stride_ot, stride_oh, a_tok, b_tok, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DK_PAD: tl.constexpr,
           DV_PAD: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr, ROWS: tl.constexpr,
           INTERPRET: tl.constexpr, ONE: tl.constexpr):
    """One chunk piece in value head i_h's columns o_v: the rows `piece` (`tok`: the token at each chunk offset; `cached`
    rows from the slot at p_slot; `loaded` ⊇ `piece` the call's rows read, see `_key_inputs`) from s0, the state at the
    chunk's start (a block of 32 columns reads it here from p_start in the run's `first` piece). ONE: the piece is one
    token's row (`_token`), whose gate inputs are the scalars a_tok and b_tok (else unread). Writes the piece's outputs,
    and its rows' inputs into the slot where the chunk stays open; returns the state after the piece (advanced where it
    closes the chunk, `stop` == C)."""
    width: tl.constexpr = DK_PAD + DV_PAD + 16 + (T_FIELD if ROWS else 0)  # triton_tiles.row_floats
    rows = tl.arange(0, C)
    tok64 = tok.to(tl.int64)
    p_cached = p_slot + rows * (HV * width)  # [C]
    if BV <= 32:
        # The piece's inputs, then the run's start state, then the arithmetic. Loaded before the loop (as wider
        # blocks do, below), the state is the loop's carried value, whose copy into the loop's registers waits for
        # it before any of the piece's loads goes out: two round trips one after the other, the larger part of an H100
        # decode step's stall samples before its first product at batch 1 (ncu). Loaded here, its conversion for the
        # products comes right after its load and so after the other loads. On an H100 (Qwen3.5-9B's heads, graph
        # replays, the same bits) a step over a chunk took 6.71 us at batch 1 against 7.20 (blocks of 32) and 7.87
        # against 7.89 at batch 2 (32); at batch 4 (blocks of 64, two programs an SM) this order took 10.40 against
        # 9.95, so wider blocks keep the other. The gates' arithmetic comes after every load too (`_key_loads`).
        kf, a_new, b_new, g_cached, beta_cached = _key_loads(k, a, b, p_cached, tok64, piece, loaded, cached, o_k, m_k, i_kh, i_h,
                                                             stride_kt, stride_kh, stride_at, DK, DK_PAD, DV_PAD)
        vf = _piece_values(v, p_cached, tok64, piece, loaded, cached, o_v, m_v, i_h, stride_vt, stride_vh, DK_PAD, DV, BV)
        qf = _query_inputs(q, tok64, piece, loaded, o_k, m_k, i_kh, stride_qt, stride_qh, DK, DK_PAD)
        s0 = tl.where(first, tl.load(p_start, mask=m_state & (pos0 > 0) & caching & first, other=0.0), s0)
        if ONE:  # the piece's one row's gate inputs: `_token`'s scalars, the same values (so the same bits) in no layout
            a_new, b_new = a_tok, b_tok
        g, beta = _gates_of(a_new, b_new, g_cached, beta_cached, piece, cached, neg_a, bias)
        s_op = _operand(s0, PRECISION, INTERPRET)
        t_rows, kn, c, inverse, w = _key_chain(kf, g, beta, p_cached, piece, cached, DK_PAD, DV_PAD, C, SUB, PRECISION, ROWS,
                                               INTERPRET)
        delta = _delta(_values(inverse, beta, vf, PRECISION, INTERPRET), w, s_op, PRECISION, INTERPRET)  # [C, BV]
        qn, scores = _queries(qf, kn, c, q_scale, C, PRECISION, INTERPRET)
    else:
        kf, g, beta, t_rows, kn, c, inverse, w = _piece_keys(k, a, b, p_cached, tok64, piece, loaded, cached, o_k, m_k, i_kh, i_h,
                                                             neg_a, bias, stride_kt, stride_kh, stride_at, DK, DK_PAD, DV_PAD, C,
                                                             SUB, PRECISION, ROWS, INTERPRET, True)  # TILED
        vf = _piece_values(v, p_cached, tok64, piece, loaded, cached, o_v, m_v, i_h, stride_vt, stride_vh, DK_PAD, DV, BV)
        s_op = _operand(s0, PRECISION, INTERPRET)
        delta = _delta(_values(inverse, beta, vf, PRECISION, INTERPRET), w, s_op, PRECISION, INTERPRET)  # [C, BV]
        qn, scores = _piece_queries(q, tok64, piece, loaded, o_k, m_k, i_kh, kn, c, q_scale, stride_qt, stride_qh, DK, DK_PAD, C,
                                    PRECISION, INTERPRET)
    o = _outputs(qn, scores, c, s_op, delta, PRECISION, INTERPRET)
    m_pv = _rows_mask(piece, m_v, DV % BV == 0)
    o_rows = tl.multiple_of(tok64 * stride_ot + i_h * stride_oh, 16)
    tl.store(out + o_rows[:, None] + o_v[None, :], o.to(out.dtype.element_ty), mask=m_pv)
    # A piece that leaves its chunk open: its rows' inputs into the slot for the next call (this block's v
    # columns; k, g and β from the last block, once every block has read the slot's earlier rows).
    keep = piece & caching & (stop < C)
    tl.store(_in_dtype(p_cached + DK_PAD, v)[:, None] + o_v[None, :], vf.to(v.dtype.element_ty), mask=_rows_mask(keep, m_v, DV % BV == 0))
    keep = keep & last_block
    tl.store(_in_dtype(p_cached, k)[:, None] + o_k[None, :], kf.to(k.dtype.element_ty), mask=_rows_mask(keep, m_k, DK == DK_PAD))
    tl.store(p_cached + DK_PAD + DV_PAD, g, mask=keep)
    tl.store(p_cached + DK_PAD + DV_PAD + 1, beta, mask=keep)
    if ROWS:
        tl.store(p_cached[:, None] + DK_PAD + DV_PAD + 16 + rows[None, :], t_rows, mask=keep[:, None])
    if stop == C:
        c_last, decayed = _decayed(kn, c, C, PRECISION, INTERPRET)
        s0 = _advanced(s0, c_last, decayed, delta, PRECISION, INTERPRET)
    return s0


@jit
def _piece_stop(positions, state_ids, tok, pos, off, slot, caching, T, C: tl.constexpr):
    """The first chunk offset past the piece that starts at offset `off` with the token at position `pos` (`tok`: the
    token at each offset, were the run to go on): where a later token's position or slot breaks the run, or the call
    or the chunk ends."""
    rows = tl.arange(0, C)
    cand = (rows >= off) & (tok < T)
    same = tl.load(positions + tok, mask=cand, other=-1) == pos + rows - off
    same = same & (~caching | (tl.load(state_ids + tok, mask=cand & caching, other=-1) == slot))
    stop = tl.min(tl.where(cand & ~same, rows, C), 0)
    return tl.minimum(stop, tl.max(tl.where(cand, rows, -1), 0) + 1)


_UNREAD: dict = {}


def _unread(device: torch.device, dtype: torch.dtype) -> Tensor:
    """A small tensor for a pointer argument the kernel never reads (no cache, or the run starts of a captured call),
    made once per device and dtype. While a CUDA graph is captured a missing one is made empty for that call alone: not
    kept (it is the graph's private memory), and no fill, which the graph would replay every step (a captured decode
    step's only call of this dtype comes under capture, since the eager calls before it pass their run starts)."""
    key = (device, dtype)
    if key not in _UNREAD:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.empty(4, dtype=dtype, device=device)
        _UNREAD[key] = torch.zeros(4, dtype=dtype, device=device)
    return _UNREAD[key]


def gdn_fwd(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size: int, out_dtype: torch.dtype,
            precision: str, block_v: int, num_warps: int, runs: Runs | None = None, inverse: str = "products") -> Tensor:
    """`runs`: `find_runs(positions, state_ids)` where the caller has it already."""
    num_tokens, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    k_pad, v_pad = _padded(k_dim), _padded(v_dim)
    out = _strided16(v.new_empty((num_tokens, num_v_heads, v_dim), dtype=out_dtype), v_pad)
    if num_tokens == 0:
        return out
    q, k, v = _strided16(q, k_pad), _strided16(k, k_pad), _strided16(v, v_pad)
    if a.stride() != b.stride() or a.stride(-1) != 1 or b.stride(-1) != 1:  # the kernel reads both with a's strides
        a, b = a.contiguous(), b.contiguous()
    a_log, dt_bias = a_log.contiguous(), dt_bias.contiguous()
    # The one-token program loads each pair (a and b, of the contract's input dtype; A_log and dt_bias, of any) through
    # one pointer tile, so a pair shares a dtype; the kernel takes the gates' inputs to fp32, so promoting keeps every value.
    if a_log.dtype != dt_bias.dtype:
        a_log, dt_bias = a_log.float(), dt_bias.float()
    positions = positions.contiguous()
    runs = runs if runs is not None else find_runs(positions, state_ids)
    has_cache = state is not None
    if has_cache and (state.data_ptr() % 16 or rows.data_ptr() % 16 or not state.is_contiguous() or not rows.is_contiguous()):
        raise ValueError("gdn.core.triton: the cache's state and rows must be contiguous and 16-byte aligned")
    block_v = min(block_v, v_pad)
    ids = state_ids.contiguous() if has_cache else _unread(positions.device, positions.dtype)
    if not has_cache:  # pointers the kernel never reads; a decode step (a CUDA graph) launches nothing else
        state = rows = _unread(v.device, torch.float32)
    every_token = runs is None
    if not every_token and _in_two_launches(num_tokens, runs.first.shape[0], num_v_heads, v.device):
        triton_two_launch.fwd(q, k, v, a, b, a_log, dt_bias, out, state, rows, ids, positions, runs, has_cache, chunk_size, precision,
                              block_v, num_warps, _walk_block(runs.first.shape[0], num_v_heads, v_dim, v.device), WALK_PREFETCH, inverse)
        return out if out.is_contiguous() else out.contiguous()
    candidates = _unread(positions.device, torch.int32) if every_token else runs.starts
    dims = dict(GROUP=num_v_heads // num_k_heads, HV=num_v_heads, DK=k_dim, DV=v_dim, DK_PAD=k_pad, DV_PAD=v_pad, C=chunk_size)
    programs = num_tokens if every_token else candidates.shape[0]
    # Split only calls of one-token runs (decode steps; a captured step's runs are not known here): a longer run
    # takes one program for its blocks in turn, which at a narrower block is work added to its chain.
    split = _split_block(programs * num_v_heads, block_v, chunk_size, v.device) if programs == num_tokens else None
    if split is not None:
        block_v = split
    gdn_fwd_kernel[(programs, num_v_heads, triton_support.cdiv(v_dim, block_v) if split is not None else 1)](
        q, k, v, a, b, a_log, dt_bias, out, state, rows, ids, positions, candidates, num_tokens, float(k_dim**-0.5), int(has_cache),
        int(every_token), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), out.stride(0),
        out.stride(1), BV=block_v, SUB=SUB, PRECISION=PRECISIONS[precision], ROWS=bool(INVERSES[inverse]), INTERPRET=triton_support.interpreting(),
        SPLIT=split is not None, num_warps=num_warps, **dims,
    )
    return out if out.is_contiguous() else out.contiguous()


def _env_int(name: str, default: int | None, least: int) -> int | None:
    """A whole number >= least from the environment variable `name`; `default` where it is unset or empty, None
    where it is `off`."""
    value = os.environ.get(name, "")
    if not value:
        return default
    if value == "off":
        return None
    if not value.isdigit() or int(value) < least:
        raise EnvError(f"{name} must be a whole number >= {least} or 'off', got {value!r}")
    return int(value)


def _env_fill(name: str, default: float | None) -> float | None:
    """Programs an SM from the environment variable `name` (a positive number); `default` where it is unset or
    empty, None where it is `off`."""
    value = os.environ.get(name, "")
    if not value:
        return default
    if value == "off":
        return None
    try:
        fill = float(value)
    except ValueError:
        fill = -1.0
    if not fill > 0:
        raise EnvError(f"{name} must be a positive number or 'off', got {value!r}")
    return fill


# The calls whose runs average at least TWO_LAUNCH_MIN_RUN tokens run in two launches (`triton_two_launch.py`: every
# chunk piece's chunk-local work at once, then a walk per run and block of value columns that carries the state alone);
# the others, and every call captured in a CUDA graph, in one, `gdn_fwd_kernel`. The rows' bits are the same either
# way (triton_two_launch.py says why; tests/ops/gdn/test_triton.py and benchmarks/gdn_bits.py compare them). On an
# H100 at Qwen3.5's heads (benchmarks/profile_gdn_fwd.py; docs/experiments.md, "Retimed on an H100" and "Two
# launches for short runs") two launches took 2 x 4096 tokens from 2.30 ms to 0.59 (32 value heads), one run of 2048
# from 1.18 to 0.22, 8 x 2048 from 1.34 to 1.16, and won at every size timed with runs of 256 and more (32 x 512: 1.45
# to 1.25; 8 x 512: 0.37 to 0.28; 8 x 256: 0.19 to 0.15; 16 value heads alike). Below, a small call's two launches
# cost the host about 0.1 ms whatever the kernels take, where one launch takes some 10 µs a chunk of its runs: runs
# of 128 won at 32 x 128 (0.38 to 0.30) and lost at 8 x 128 (0.094 to 0.106) and 1 x 128 (0.079 to 0.101).
# TWO_LAUNCH_MAX_FILL, where set, keeps in one launch the calls whose one launch would have more programs (runs x value
# heads) an SM than it: it bounds the two launches' buffers (1.3 KB a token and value head) too.
# ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN=n (or `off`: one launch always) sets the run length for a process,
# ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL=x the fill (`off`, the default: no bound); off a GPU the run length alone decides.
TWO_LAUNCH_MIN_RUN: int | None = _env_int("ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN", 256, least=1)
TWO_LAUNCH_MAX_FILL: float | None = _env_fill("ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL", None)
# The walk's block of value columns, None for the contract's `block_v` (ISOEXEC_GDN_WALK_BLOCK_V=n, a power of
# two >= 16, or `off`, sets it for a process): an output element's products run over the head dim whatever the block's
# width, so its bits do not depend on it (equal on the CPU and, at heads of 128, on an H200), and a narrower block
# keeps the walk's state tile in fewer registers (ptxas for sm_90, heads of 128: 255 registers and 248 bytes of
# spills at 128 columns, 204 and none at 64, 174 at 32). A narrower block also means more programs, each loading the
# run's keys again: WALK_NARROW (below) takes one where the walk at WALK_BLOCK_V would leave SMs idle.
WALK_BLOCK_V: int | None = _env_int("ISOEXEC_GDN_WALK_BLOCK_V", 64, least=16)
if WALK_BLOCK_V is not None and WALK_BLOCK_V & (WALK_BLOCK_V - 1):
    raise EnvError(f"ISOEXEC_GDN_WALK_BLOCK_V must be a power of two >= 16, got {WALK_BLOCK_V}")
# Whether the walk loads a piece's tiles while the piece before it computes (ISOEXEC_GDN_WALK_PREFETCH=0 turns it
# off): the loads' latency leaves the state's chain, for the registers of a second set of tiles (241 at 64 columns
# with the decayed keys among them, no spills; at 128 the spills grow); 0.91 ms against 1.47 for one run of 512
# tokens on an H200 (before the decayed keys joined the prefetch).
WALK_PREFETCH: bool = bool(_env_int("ISOEXEC_GDN_WALK_PREFETCH", 1, least=0))


# Calls of one-token runs (decode steps) with few programs (runs x value heads) an SM split the value columns over
# the grid: a program per block of columns, each with its columns of the state, where one program took them all in
# turn. SPLITS lists (block of columns, most unsplit programs an SM) from the narrowest block: a call takes the
# narrowest whose bound it meets. On an H100 at Qwen3.5's heads (32 and 16 value heads of 128; benchmarks/gdn_split.py;
# docs/experiments.md, "Retimed on an H100"), per step over a chunk: blocks of 32 were fastest up to 64 unsplit
# programs (a batch-1 step at 32 heads: 11.7 us to 8.7), 64 at 128 (batch 4 at 32 heads: 12.6 to 11.6), no split from
# 256 (batch 8 at 32 heads: 16.1 unsplit, 19.5 in blocks of 64). An output element's products run over the head dim
# whatever the block's width, as the two-launch walk's do (WALK_BLOCK_V): the same bits (tests/ops/gdn/test_triton.py;
# every step's, split or not, on the H100).
# ISOEXEC_GDN_SPLITS=32:0.5,64:1 sets them for a process (`off`: no split); SPLIT_BLOCK_V (a test's) forces one
# block for every such call, as the interpreter's calls take it.
def _env_splits(name: str, default: tuple) -> tuple:
    value = os.environ.get(name, "")
    if not value:
        return default
    if value == "off":
        return ()
    try:
        splits = tuple(sorted((int(block), float(fill)) for block, fill in (item.split(":") for item in value.split(","))))
    except ValueError:
        splits = ()
    if not splits or any(block < 16 or block & (block - 1) or not fill > 0 for block, fill in splits):
        raise EnvError(f"{name} must be `off` or blocks:programs-an-SM pairs like 32:0.5,64:1 (blocks powers of two >= 16), got {value!r}")
    return splits


SPLITS: tuple = _env_splits("ISOEXEC_GDN_SPLITS", ((32, 0.5), (64, 1.0)))
SPLIT_BLOCK_V: int | None = None
# The walk's narrower blocks, (block, most programs an SM at WALK_BLOCK_V) as SPLITS reads them: a call whose walk
# would have at most that many programs (runs x value heads x blocks of WALK_BLOCK_V columns) an SM takes the
# narrowest such block. On an H100 at heads of 128 (`benchmarks/RESULTS.md`, "Every phase by the kernels' device
# time"), kernels ms at 64 columns -> 32: a prefill of 2,048 tokens 0.220 -> 0.198 (one run, 32 value heads: 0.48
# programs an SM), 0.185 -> 0.160 (16 heads, 0.24); a training forward at 2 x 4,096, 16 heads (0.48) 0.438 -> 0.396;
# at 8 x 2,048, 16 heads (1.94) 0.575 -> 0.679, slower (the training pairs from two machines of one kind). Between 0.5
# and 1.9 programs an SM is not measured: the bound sits at one program an SM. ISOEXEC_GDN_WALK_NARROW=32:1 sets it
# for a process (`off`: WALK_BLOCK_V always).
WALK_NARROW: tuple = _env_splits("ISOEXEC_GDN_WALK_NARROW", ((32, 1.0),))


@functools.cache
def _num_sms(device: torch.device) -> int:
    """The GPU's SM count, read once a device: both path choices below run on every eager decode call."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split_block(programs: int, block_v: int, chunk_size: int, device: torch.device) -> int | None:
    """The value columns' block where a call of one-token runs splits them over the grid, else None (chunks of 64
    take blocks of 64 columns or more: check_constants says why)."""
    if SPLIT_BLOCK_V is not None or device.type != "cuda":
        choices = [SPLIT_BLOCK_V] if SPLIT_BLOCK_V is not None else []
    else:
        choices = [block for block, fill in SPLITS if programs <= fill * _num_sms(device)]
    choices = [block for block in choices if block < block_v and (chunk_size < 64 or block >= 64)]
    return choices[0] if choices else None


def _walk_block(runs: int, num_v_heads: int, v_dim: int, device: torch.device) -> int | None:
    """The two-launch walk's block of value columns for a call of `runs` runs (WALK_NARROW's rule; off a GPU,
    WALK_BLOCK_V)."""
    if WALK_BLOCK_V is None or device.type != "cuda":
        return WALK_BLOCK_V
    programs = runs * num_v_heads * triton_support.cdiv(v_dim, WALK_BLOCK_V)
    return next((block for block, fill in WALK_NARROW if block < WALK_BLOCK_V and programs <= fill * _num_sms(device)), WALK_BLOCK_V)


def _in_two_launches(num_tokens: int, runs: int, num_v_heads: int, device: torch.device) -> bool:
    if TWO_LAUNCH_MIN_RUN is None or num_tokens < TWO_LAUNCH_MIN_RUN * runs:
        return False
    if TWO_LAUNCH_MAX_FILL is None or device.type != "cuda":
        return True
    return runs * num_v_heads <= TWO_LAUNCH_MAX_FILL * _num_sms(device)



class _TritonGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, a, b, a_log, dt_bias, positions, chunk_size, dtypes, tiles, runs):
        ctx.save_for_backward(q, k, v, a, b, a_log, dt_bias, positions)
        ctx.tiles = tiles
        ctx.runs = runs  # for the backward too (None while a graph is captured)
        return gdn_fwd(q, k, v, a, b, a_log, dt_bias, None, None, None, positions, chunk_size, torch_dtype(dtypes["output_dtype"]),
                       runs=ctx.runs, **tiles)

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        grads = gdn_bwd(*saved, grad, ctx.tiles["precision"], ctx.runs)
        return (*(g.to(t.dtype) if need else None for g, t, need in zip(grads, saved, ctx.needs_input_grad)), None, None, None, None, None)


def check_constants(constants: dict) -> None:
    """Refuse dtypes, chunk sizes and precisions the kernel does not implement (one-line ValueErrors)."""
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    for name in ("input_dtype", "output_dtype"):
        if constants[name] not in DTYPES:
            raise ValueError(f"{ID}: {name} must be one of {', '.join(DTYPES)}, got {constants[name]!r}")
    chunk = constants["chunk_size"]
    if chunk not in (16, 32, 64):
        raise ValueError(f"{ID}: chunk_size must be 16, 32 or 64 (whole {SUB}-row blocks of the inverse, tl.dot's smallest tile), "
                         f"got {chunk!r}")
    block_v = constants["block_v"]
    if not isinstance(block_v, int) or block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"{ID}: block_v must be a power of two >= 16, got {block_v!r}")
    if chunk == 64 and block_v < 64:
        # Compiled for sm_90 by Triton 3.6 at heads of 128, this pair faults in a shared-memory read Triton
        # plans for the q norm's reduction (compute-sanitizer; docs/experiments.md, 2026-12-02).
        raise ValueError(f"{ID}: chunk_size 64 needs block_v >= 64 (smaller value blocks crash the compiled kernel), got {block_v}")
    if constants["dot_precision"] not in PRECISIONS:
        raise ValueError(f"{ID}: dot_precision must be one of {', '.join(PRECISIONS)}, got {constants['dot_precision']!r}")
    if constants.get("inverse", "products") not in INVERSES:
        raise ValueError(f"{ID}: inverse must be one of {', '.join(INVERSES)}, got {constants['inverse']!r}")
    if constants["num_warps"] not in (1, 2, 4, 8, 16):
        raise ValueError(f"{ID}: num_warps must be a power of two <= 16, got {constants['num_warps']!r}")


def gdn_core(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, state: Tensor | None = None,
             rows: Tensor | None = None, state_ids: Tensor | None = None, positions: Tensor | None = None, *, input_dtype: str,
             output_dtype: str, accum_dtype: str, chunk_size: int, dot_precision: str, block_v: int, num_warps: int,
             inverse: str = "products") -> Tensor:
    """Same arguments and result as `reference.gdn_core` (its docstring), with this impl's cache rows
    [N, C, Hv, `row_width`]: the open chunk's inputs."""
    check_constants(dict(input_dtype=input_dtype, output_dtype=output_dtype, accum_dtype=accum_dtype, chunk_size=chunk_size,
                         dot_precision=dot_precision, block_v=block_v, num_warps=num_warps, inverse=inverse))
    if positions is None:
        raise ValueError("gdn.core: positions are required")
    check_inputs(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size, input_dtype,
                 row_width(v.shape[1], q.shape[-1], v.shape[-1], dict(inverse=inverse)))
    runs = find_runs(positions, state_ids)  # one host read a forward (runs.py), the checks' values with it
    check_runs(runs, state)
    require_device(ID, q, k, v, a, b)
    tiles = dict(precision=dot_precision, block_v=block_v, num_warps=num_warps, inverse=inverse)
    if needs_grad(q, k, v, a, b, a_log, dt_bias):
        dtypes = dict(input_dtype=input_dtype, output_dtype=output_dtype)
        return _TritonGDN.apply(q, k, v, a, b, a_log, dt_bias, positions, chunk_size, dtypes, tiles, runs)
    return gdn_fwd(q, k, v, a, b, a_log, dt_bias, state, rows, state_ids, positions, chunk_size, torch_dtype(output_dtype), runs=runs,
                   **tiles)


SOURCES = (triton_tiles, triton_two_launch, triton_support)  # beside this file: the source files that decide the bits


def register(registry) -> None:
    """Register gdn.core.triton@3; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=VERSION, region="gdn.core", cases=ALL_CASES, fn=gdn_core,
                               check_constants=check_constants, sources=SOURCES, row_width=row_width))
