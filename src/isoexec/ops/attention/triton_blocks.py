"""attention.triton's decode rows with the key blocks spread over the grid, for a decode batch of few programs.

`attention_fwd` gives a decode query one program per KV head, which walks every key block of the row in turn:
at batch 1 with 8 KV heads, 8 programs of a GPU's 132 SMs each fold 64 blocks of 32 keys for a 2048-token row,
one after the other. The row's bits come from that fold (triton.py's module doc): per block, in ascending order,

    s = (q · k) * scale;  m' = max(m, max_j s);  p = exp(s - m'_safe);  alpha = exp(m - m'_safe)
    l' = l * alpha + sum_j p;  acc' = acc * alpha + (p · v)

A block's s, p, p · v and sum_j p depend on the blocks before it only through m, the running maximum, and a
maximum is exact in any order. So three launches compute the same values:

1. `block_max_kernel`, P programs per (query, KV head), each dealt a contiguous run of the row's key blocks: each
   block's scores (`MAX_RUN` blocks a product), stored, and their row maxima;
2. `block_terms_kernel`, P' programs per (query, KV head) over runs of their own (fewer than P: its registers let
   fewer share an SM, and a block's scores do not depend on which run computed them): m before the program's run (the
   maximum of the earlier blocks' maxima), then along the run as the walk carries it, and each block's alpha,
   sum_j p and p · v from its stored scores and its V, by the same helpers on the same 64-row tile as the walk, so the
   same instructions (the tile decides an MMA's bits, not which rows fill it);
3. `fold_kernel`, programs per (query, KV head) over slices of the columns: l and acc folded over the blocks in
   ascending order with the walk's multiply-adds, then the walk's division and zero select.

The terms kernel reads K not at all: each block's scores come from the max kernel (fp32, [G_PAD, BLOCK_N] a block),
the same values as a product of the block alone would give (a score is its row's and key's sum over D, which the
product's width does not enter). Compiled for sm_90a at Qwen3-8B's heads (`benchmarks/attention_sass.py`) its loop over
whole blocks issues 274 SASS instructions against 414 with K gathered and q · k repeated, at 128 registers (126), and
the max kernel's, storing the scores, 281 against 250 at 120 registers (104). One thing the interpreter cannot show: a
row's maximum and sum over the scores reduce in the order their layout gives, and loaded scores come in the load's
layout (4 columns a thread), not the product's accumulator layout (8 columns a thread) that the walk reduces over;
loaded as they come, the Qwen3-8B-shaped audit mismatched (110 of 256 tokens) while single bf16 outputs kept their
bits. `_in_product_layout` pins them to the product's layout. On an H100 (graph replays, `benchmarks/RESULTS.md`),
against q · k repeated: Qwen3-8B's heads at 1 x 2,048 / 8,192 keys 19.9 / 43.5 -> 19.6 / 40.7 us, 4 x 2,048 38.0 ->
35.0, 8 x 2,048 62.1 -> 56.0; Qwen3.5-9B's (16 x 4 heads of 256) 8 x 2,048 71.0 -> 58.7; every family's audit bitwise.
A register cap of 128 held at head_dim 128 but cannot compile head_dim 256 (ptxas asks for 158), and gained nothing.

Both blocks kernels wait on memory latency along short runs of blocks rather than on bandwidth (Nsight Compute on an
H100: a quarter to a third of DRAM bandwidth), and issue many instructions a block (below `MAX_SLOTS_AHEAD`). Changes
that kept the bits gave nothing at batch 1-8 (`benchmarks/RESULTS.md`): a fold that reads four
blocks' terms a load, and blocks kernels that ask for the next block's K and V before the current block's product (the
terms kernel at 204 registers); nor, later, prefetch instructions for the next step's table line and K or V, which cost
no registers (`MAX_SLOTS_AHEAD`'s comment), nor p · V in four slices of V's columns (104 registers, 96 under a cap, five
programs an SM): the same bits, and slower at every size (1 x 8,192 keys 45.7 -> 54.1 us). Two changes that cut the
blocks kernels' instructions further with the same values gained nothing on an H100, alone or beside the kept scores:
the max kernel scaling its blocks' maxima instead of its scores, and both kernels walking a program's whole blocks
with no key masks once they had found all their slots in the store (max loop 250 -> 201 SASS instructions, terms loop
414 -> 339: within 0.7 us at batch 1-8); nor did a fold reading an iteration's blocks' terms by one load a term, with
up to 112 blocks in flight (1 x 8,192 keys 43.9 -> 42.8 us, 8 x 2,048 62.8 -> 94.4).

`block_max_kernel` and `fold_kernel` launch with programmatic dependent launch (`triton_support.jit(dependent=True)`), as
the walk and the rest of a decode step do; `block_terms_kernel` does not. A dependent kernel lets the kernel behind it
launch once its own programs are past their wait, so the next kernel's programs take whatever SM room is free while its
last wave still runs. Launched so behind the terms kernel (several waves of programs), the fold's few long,
serial programs ran slower: on an H100 at batch 1 (graph replays, `benchmarks/attention_spread.py`), 46.3 / 155.2 us at 2,048
/ 8,192 keys with PDL on the terms kernel and the fold, 26.1 / 80.7 with it on every kernel but the terms one, 26.5 /
80.8 with it on none. Without PDL the terms kernel lets the fold launch only as its programs end. Compiled for sm_90a,
each dependent kernel's floating-point and MMA instructions are the same sequence with PDL on and off (register names
aside), beside the two `griddepcontrol` instructions (`benchmarks/pdl_ptx.py`).

What stays serial is the fold, one multiply-add per element a block. Bits equal to the walk's are shown in the
interpreter (tests/ops/attention/test_triton.py); on a GPU the two places a compiler could part them are the fold's
multiply-adds (compiled for sm_90a, both kernels contract them to `fma.rn.f32`) and p · v, a separate sum in both
(`settled` in the walk, a store here). On an H100 the rows were the walk's bit for bit at batch 1-16 and 128-8,192
keys at every launch setting swept, and with blocks dealt in strides (before contiguous runs) the GPU tests passed and
the 0.6B- and 8B-shaped audits were bitwise with every decode step spread (docs/experiments.md, "The spread
decode"); `ISOEXEC_ATTENTION_BLOCKS_MIN` sets the threshold, `off` turns it off.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from ...env import EnvError
from .. import triton_support
from ..triton_support import after_upstream, cdiv, jit, next_power_of_2, tl
from .triton_steps import (_block_slots, _finish, _fold_sums, _gather_v, _in_range, _probs_times_v, _row_sum, _running_max, _scores,
                           _visible_slots)


def _env_blocks(name: str, default: int | None) -> int | None:
    value = os.environ.get(name, "")
    if value == "":
        return default
    if value == "off":
        return None
    if not value.isdigit() or int(value) < 1:
        raise EnvError(f"{name} must be a positive number of key blocks or 'off', got {value!r}")
    return int(value)


# A decode call takes this path where its rows span at least BLOCKS_MIN key blocks of the table and its programs
# (queries x KV heads) are at most BLOCKS_MAX_FILL an SM (None: never). On an H100 at Qwen3-8B's heads (graph replays,
# benchmarks/attention_blocks.py) the spread rows beat the walk from 8 blocks of 32 keys at batch 1 (128 keys: even) and
# up to batch 8 (64 programs, half the SMs: 84 against 109 us at 2,048 keys), and lost from batch 16 (142-161 against 109).
BLOCKS_MIN: int | None = _env_blocks("ISOEXEC_ATTENTION_BLOCKS_MIN", 8)
BLOCKS_MAX_FILL = 0.5
# Each blocks kernel deals a row's blocks to about as many programs an SM, over the call's rows, as one SM holds at
# once (`_resident`: by the compiled kernel's registers, shared memory and threads), so that they run as one wave with
# each program's run as short as that allows. PROGRAM_WAVES (the terms kernel) and MAX_PROGRAM_WAVES (the max kernel)
# set a number instead (None: the rule). On an H100 (graph replays, the same bits) the rule (terms and max kernel: 4
# and 4 programs an SM at Qwen3-8B's heads, 2 and 3 at Qwen3.5-9B's (16, 4, 256), 3 and 4 at Qwen3-30B-A3B's (32, 4,
# 128)) against the 4 and 6 set before it: 8 x 2,048 keys 56.4 -> 54.5 us at the first, batch 1-4 within 0.1 us; 1 x
# 8,192 44.4 -> 43.8, 2 / 8 x 2,048 26.4 / 58.4 -> 25.5 / 57.0 at the second; 1 x 8,192 34.7 -> 33.4, 2 / 4 x 2,048
# 21.6 / 28.2 -> 20.8 / 26.8 at the third (8 x 2,048 42.5 -> 42.8); a call before, setting those numbers as knobs,
# agreed. Fewer programs than fit (3 for the terms kernel at Qwen3-8B's heads: 1 x 8,192 40.7 -> 43.7 us) or more (6,
# 8: 43.3, 41.8) lost, as 8 and 16 had against 4 when it held 126 registers (21.8 / 60.0 us at 2,048 / 8,192 keys,
# 22.7 / 62.0 at 8, 22.8 / 69.4 at 16).
PROGRAM_WAVES: int | None = None
MAX_PROGRAM_WAVES: int | None = None
# The constants below were chosen on an H100 (benchmarks/attention_spread.py; batch 1 at 2,048 / 8,192 keys):
# - BLOCK_STAGES, the terms kernel's loads in flight along its run of blocks (then both blocks kernels'; the max kernel's
#   runs are now a loop of products, not pipelined): 1 (none ahead) beat 2 and 3 at every size (27.1 / 66.0 us at 2,
#   29.3 / 70.8 at 3), and 2 lost again with the kept scores (50.3 us at 1 x 8,192);
# - FOLD_STAGES, the fold's blocks' terms in flight: 8 (16 gained 1-3% more);
# - the fold's programs a (query, KV head), each over head_dim / FOLD_SPLIT of acc's columns, their warps, and the
#   blocks an iteration of its loop: 4 programs of 2 warps at 4 blocks an iteration took 24.0 / 71.8 us against
#   26.8 / 88.5 for one program of 4 warps at one block, and was within 1 us of the best setting tried at batch 4 to 16.
# The max kernel's key blocks a product: MAX_RUN blocks' scores from one [ROWS, MAX_RUN * BLOCK_N] product, their K
# gathered by one load, so a run's loads go out together instead of one block's after the other's maxima. A score
# is its row's and key's sum over D alone, which the product's width does not enter (the blocks' maxima, exact in any
# order, are the walk's; on an H100 every row kept its bits at 2, 4 and 8); runs are dealt in multiples of MAX_RUN
# blocks. On an H100 (graph replays, three calls on one machine) 2 against 1 took batch 1 at 512 / 2,048 / 8,192 keys
# from 16.3 / 22.4 / 55.0 to 15.5 / 22.2 / 52.2 us, 4 x 2,048 from 46.6 to 43.5 and 8 x 2,048 from 75.3 to 73.6; 4 and
# 8 gained less or lost.
MAX_RUN = 2
# A step of the blocks kernels gathers K (and V) through the table's slots for its keys: two round trips, one after the
# other. With MAX_SLOTS_AHEAD the max kernel loads the next step's slots while a step computes and carries them in
# registers (`_slots_ahead`; [MAX_RUN * BLOCK_N] int32, validated against the store first), so a step waits on its
# gather alone. Compiled for sm_90a it takes 102 registers against 128 (the slot checks folded into one). On an H100
# (graph replays, one call) 1 x 512 / 2,048 / 8,192 keys 15.6 -> 15.4, 22.2 -> 22.0, 52.0 -> 51.5 us, 4 x 2,048 43.7 ->
# 43.3, 8 x 2,048 73.2 -> 73.1: a little, kept for the registers. The terms kernel does not: carried slots took it from
# 126 to 163 registers (the compiler carries a copy in each layout that reads them). Asking for the next step's table
# line (L1) and keys or values (L2) by prefetch instructions instead, in both kernels, kept the terms kernel at 128
# registers and lost: 8,192 keys 51.6 -> 54.5 us, 4 x 2,048 43.2 -> 45.3, 8 x 2,048 73.4 -> 76.3 (benchmarks/RESULTS.md).
# Which slots a step reads does not change, nor any arithmetic.
MAX_SLOTS_AHEAD = True
# Instructions, not bandwidth, may bound the three kernels: compiled for sm_90a (benchmarks/sm90.py) the terms kernel's loop
# over a row's last block issues 659 SASS instructions a warp, most of them integer and predicate logic (the per-row,
# per-key masks that block needs), the max kernel's 420 a run of two, the fold's 199 per four blocks (84 of them the
# per-block masks of a row that may end inside an iteration); the slot checks are one unsigned compare (`_in_range`: 699
# and 558 with two signed ones). So each kernel walks the blocks wholly below the row in a loop of its own with the
# keys' slot checks alone (414 and 250 instructions), and the fold its whole iterations with no block mask (105), the
# row's last blocks masked after them: the same values in the same order. On an H100 (graph replays, one call) that took
# batch 1 at 2,048 / 8,192 keys from 22.1 / 53.1 to 20.6 / 45.7 us, 4 x 2,048 from 44.2 to 38.1 and 8 x 2,048 from 73.5
# to 62.9, the rows' bits unchanged.
BLOCK_STAGES = 1
FOLD_STAGES = 8
FOLD_SPLIT = 4
FOLD_WARPS = 2
# Where a call has few (query, KV head) rows, the fold splits the columns further, up to FOLD_MAX_SPLIT programs a row
# of one warp each, while the call's fold programs still number at most the SMs (`_fold_programs`): each element's chain
# is the same, so its bits are. On an H100 (graph replays, two calls on two machines) 16 programs of one warp at batch 1
# (128 programs) took 1 x 2,048 / 8,192 keys from 20.8 / 46.0 to 20.3 / 44.2 us and 20.4 / 45.7 to 19.6 / 44.4, 1 x 512
# 14.4 to 13.9; at batch 4 and 8 (256 and 512 programs) it lost 2-6 us, where the rule keeps FOLD_SPLIT. The rule
# itself against FOLD_SPLIT everywhere (an H100, 2267947): batch 1 at 512 / 2,048 / 8,192 keys 14.1 / 20.3 / 46.0 ->
# 13.8 / 19.8 / 43.8 us, 2 x 2,048 26.3 -> 25.4, batch 4 and 8 the same.
FOLD_MAX_SPLIT = 16
FOLD_UNROLL = 4
# The earlier blocks' maxima a terms program reads in one load before its run (a [chunk, G_PAD] tile): one load for
# tables up to 16,384 keys at block_n 32.
MAX_CHUNK = 512


@jit
def _decode_rows(q, i, kv_head, stride_qt, stride_qh, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                 DOT_IN_FP32: tl.constexpr):
    """Query i's rows as `_tile` lays out a tile of one query (rows r < G its heads, the others zero): [ROWS, D]
    and which rows are real."""
    rows = tl.arange(0, ROWS)
    row_ok = rows < G
    o_d = tl.arange(0, D)
    b_q = tl.load(q + i.to(tl.int64) * stride_qt + (kv_head * G + rows % G_PAD)[:, None] * stride_qh + o_d[None, :], mask=row_ok[:, None],
                  other=0.0)
    if DOT_IN_FP32:
        b_q = b_q.to(tl.float32)
    return b_q, row_ok


@jit
def _block_keys(slots, row_ok, p_i, i_blk, full, L, S, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, FULL: tl.constexpr):
    """Block i_blk's slots (loaded: `slots`), which keys each row sees, which keys some row sees and which rows see a
    key, as `_full_block` (a block wholly below the row: every row sees each key whose slot lies in the store) or
    `_block` (the row's last) take them: the former where FULL (known when compiled), else as `full` says."""
    if FULL:
        ok = _in_range(slots, S)
        everyone = tl.arange(0, ROWS) >= 0
        vis, key_ok, row_active = ok[None, :] & everyone[:, None], ok, everyone
    else:
        slots, vis_part, key_ok_part, active_part = _visible_slots(slots, i_blk, tl.where(row_ok, p_i, -1), row_ok, L, S, 0, False,
                                                                   BLOCK_N)
        ok = _in_range(slots, S)
        everyone = tl.arange(0, ROWS) >= 0
        vis = tl.where(full, ok[None, :] & everyone[:, None], vis_part)
        key_ok = tl.where(full, ok, key_ok_part)
        row_active = tl.where(full, everyone, active_part)
    return slots, vis, key_ok, row_active


@jit
def _row_blocks(p_i, L, BLOCK_N: tl.constexpr):
    """The key blocks a decode row at position p_i walks (0 for a row that sees no key)."""
    hi_key = tl.minimum(p_i, L - 1)
    return tl.where(hi_key >= 0, hi_key // BLOCK_N + 1, 0)


@jit
def _program(i, c, P, seq_ids, positions, slot_table, L, stride_sb, BLOCK_N: tl.constexpr, MULTIPLE: tl.constexpr = 1):
    """Query i's position, its table row, the walk's first partial block (`full_blk`), and the row's blocks
    [lo, hi) program c of P takes: a contiguous run of cdiv(row blocks, P), rounded up to a multiple of MULTIPLE."""
    p_i = tl.load(positions + i).to(tl.int32)
    seq_row = slot_table + tl.load(seq_ids + i).to(tl.int64) * stride_sb
    hi_blk = _row_blocks(p_i, L, BLOCK_N)
    per = tl.cdiv(tl.cdiv(hi_blk, P), MULTIPLE) * MULTIPLE
    lo = c * per
    return p_i, seq_row, (tl.minimum(p_i, L - 1) + 1) // BLOCK_N, lo, tl.minimum(lo + per, hi_blk)


@jit
def _whole_runs_end(lo, hi, full_blk, RUN: tl.constexpr):
    """The end of a max program's runs wholly below the row: blocks [lo, end) in runs of RUN."""
    return lo + tl.maximum(tl.minimum(hi, full_blk) - lo, 0) // RUN * RUN


@jit
def _first_slots(lo, seq_row, L, S, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, AHEAD: tl.constexpr):
    """The slots a run's loop starts with: those of its first WIDTH keys from block lo where AHEAD (`_slots_ahead`)."""
    if AHEAD:
        slots = _carried_slots(lo * BLOCK_N, seq_row, L, S, WIDTH)
    else:
        slots = tl.full([WIDTH], -1, dtype=tl.int64)
    return slots


@jit
def _slots_ahead(slots, i_blk, STEP: tl.constexpr, seq_row, L, S, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, AHEAD: tl.constexpr):
    """(the slots the loop carries on, the slots of the WIDTH keys from block i_blk). AHEAD: the latter are those the
    last iteration loaded (`slots`), and the next step's (block i_blk + STEP) are loaded now, so that a step's gathers
    wait on one round trip, not on the table's and then the store's; else this step's, loaded now. The table's
    integers alone: no arithmetic changes."""
    if AHEAD:
        now = slots.to(tl.int64)
        slots = _carried_slots((i_blk + STEP) * BLOCK_N, seq_row, L, S, WIDTH)
    else:
        now = _block_slots(i_blk * BLOCK_N, seq_row, L, WIDTH)
        slots = now
    return slots, now


@jit
def _carried_slots(first_key, seq_row, L, S, WIDTH: tl.constexpr):
    """`_block_slots`, carried to the next step as int32 (half the registers): a slot outside the store becomes -1
    first, so the step's checks (at or above 0, below S) see the same keys as valid."""
    slots = _block_slots(first_key, seq_row, L, WIDTH)
    return tl.where(_in_range(slots, S), slots, -1).to(tl.int32)


@jit
def _run_max(slots, b_q, row_ok, p_i, i_blk, hi, kv_head, k, maxima, scores, head_base, L, S, scale, stride_ks, stride_kh,
             G_PAD: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, RUN: tl.constexpr,
             DOT_IN_FP32: tl.constexpr, FULL: tl.constexpr):
    """Blocks [i_blk, i_blk + RUN)'s scores and row maxima, those below hi stored: the RUN blocks' keys (`slots`, loaded)
    gathered as one K tile and scored by one product, each key masked as the block steps mask it (at or before the row's
    position, inside the table, its slot in the store: FULL, blocks wholly below the row, needs the last alone), then
    each block's slice reduced."""
    if FULL:
        in_store = _in_range(slots, S)
        vis, key_ok = in_store[None, :] & row_ok[:, None], in_store
    else:
        keys = i_blk * BLOCK_N + tl.arange(0, RUN * BLOCK_N)
        vis = (keys[None, :] <= p_i) & (keys[None, :] < L) & _in_range(slots, S)[None, :] & row_ok[:, None]
        key_ok = tl.max(vis.to(tl.int32), 0) > 0
    o_d = tl.arange(0, D)
    b_k = tl.load(k + slots[None, :] * stride_ks + kv_head * stride_kh + o_d[:, None], mask=key_ok[None, :], other=0.0)
    if DOT_IN_FP32:
        b_k = b_k.to(tl.float32)
    s = _scores(b_q, b_k, vis, scale, DOT_IN_FP32)
    block_max = tl.max(tl.reshape(s, [ROWS, RUN, BLOCK_N]), 2)  # [ROWS, RUN]
    rows, runs = tl.arange(0, ROWS), tl.arange(0, RUN)
    tl.store(maxima + (head_base + i_blk + runs[None, :]) * G_PAD + rows[:, None], block_max,
             mask=(rows < G_PAD)[:, None] & (i_blk + runs < hi)[None, :])
    cols = tl.arange(0, RUN * BLOCK_N)  # each block's scores, [G_PAD, BLOCK_N] a block, for the terms kernel
    blk = i_blk + cols // BLOCK_N
    tl.store(scores + ((head_base + blk[None, :]) * G_PAD + rows[:, None]) * BLOCK_N + (cols % BLOCK_N)[None, :], s,
             mask=(rows < G_PAD)[:, None] & (blk < hi)[None, :])


@jit(do_not_specialize=["L", "S"], dependent=True)
def block_max_kernel(
    q, k, slot_table, seq_ids, positions, maxima, scores, L, S, scale, stride_qt, stride_qh, stride_ks, stride_kh, stride_sb,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, DOT_IN_FP32: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    NB: tl.constexpr, RUN: tl.constexpr = 1, AHEAD: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Program (query i, KV head, c): for its run of the row's blocks, each block's scores into scores[i, head, j] and
    their row maxima into maxima[i, head, j, :G_PAD], RUN blocks a product (`_run_max`)."""
    after_upstream(PDL)
    i, kv_head = tl.program_id(0), tl.program_id(1)
    p_i, seq_row, full_blk, lo, hi = _program(i, tl.program_id(2), tl.num_programs(2), seq_ids, positions, slot_table, L,
                                               stride_sb, BLOCK_N, RUN)
    slots = _first_slots(lo, seq_row, L, S, BLOCK_N, RUN * BLOCK_N, AHEAD)
    b_q, row_ok = _decode_rows(q, i, kv_head, stride_qt, stride_qh, G, G_PAD, D, ROWS, DOT_IN_FP32)
    head_base = (i.to(tl.int64) * tl.num_programs(1) + kv_head) * NB
    # Runs wholly below the row take the keys' slot checks alone (FULL) in a loop of their own, the runs from the one
    # holding the row's last block its position's masks too, after them (every run masked gives the same values with
    # more instructions a block). No terms program reads the maxima of the row's last block: it lies inside the last
    # run, whose program carries its own maximum there.
    whole = _whole_runs_end(lo, hi, full_blk, RUN)
    i_run = lo
    while i_run < whole:
        slots, now = _slots_ahead(slots, i_run, RUN, seq_row, L, S, BLOCK_N, RUN * BLOCK_N, AHEAD)
        _run_max(now, b_q, row_ok, p_i, i_run, hi, kv_head, k, maxima, scores, head_base, L, S, scale, stride_ks, stride_kh,
                 G_PAD, ROWS, D, BLOCK_N, RUN, DOT_IN_FP32, True)
        i_run += RUN
    while i_run < hi:
        slots, now = _slots_ahead(slots, i_run, RUN, seq_row, L, S, BLOCK_N, RUN * BLOCK_N, AHEAD)
        _run_max(now, b_q, row_ok, p_i, i_run, hi, kv_head, k, maxima, scores, head_base, L, S, scale, stride_ks, stride_kh,
                 G_PAD, ROWS, D, BLOCK_N, RUN, DOT_IN_FP32, False)
        i_run += RUN


@jit
def _block_terms(m, slots, q, row_ok, p_i, i_blk, full_blk, kv_head, v, scores, alphas, sums, pvs, head_base, L, S, stride_vs,
                 stride_vh, G: tl.constexpr, G_PAD: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr, FULL: tl.constexpr):
    """Block i_blk's alpha, sum_j p and p · v from m, the walk's running maximum before it, its scores as the max kernel
    stored them (rows from G_PAD on see no key: -inf) and its values, stored; returns m after it. FULL: a block wholly
    below the row (`_block_keys`)."""
    slots, _, key_ok, row_active = _block_keys(slots, row_ok, p_i, i_blk, i_blk < full_blk, L, S, ROWS, BLOCK_N, FULL)
    b_v = _gather_v(slots, key_ok, kv_head, v, stride_vs, stride_vh, D, DOT_IN_FP32)
    r = tl.arange(0, ROWS)
    s = tl.load(scores + ((head_base + i_blk) * G_PAD + r[:, None]) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :],
                mask=(r < G_PAD)[:, None], other=float("-inf"))
    s = _in_product_layout(s, q, DOT_IN_FP32)
    m_new, m_safe, alpha = _running_max(m, s, DOT_IN_FP32)
    p, pv = _probs_times_v(s, m_safe, b_v, DOT_IN_FP32)
    p_sum = _row_sum(p, SUM_BY_DOT)
    alpha = tl.where(row_active, alpha, 1.0)
    p_sum = tl.where(row_active, p_sum, 0.0)
    pv = tl.where(row_active[:, None], pv, 0.0)
    rows = tl.arange(0, ROWS)
    keep = rows < G
    at = (head_base + i_blk) * G_PAD + rows
    tl.store(alphas + at, alpha, mask=keep)
    tl.store(sums + at, p_sum, mask=keep)
    tl.store(pvs + at[:, None] * D + tl.arange(0, D)[None, :], pv, mask=keep[:, None])
    return m_new


@jit
def _in_product_layout(s, q, DOT_IN_FP32: tl.constexpr):
    """s [ROWS, BLOCK_N] as the accumulator of a product of zeros of the walk's operand type (q's, or fp32 where
    DOT_IN_FP32): the same values (a -0.0 may turn +0.0, which no maximum, difference or exp of the walk's tells apart)
    in the layout a product's scores come in, so that a row's maximum and sum over them run in the walk's order (a
    reduction's order follows its operand's layout; loaded, they would come in the load's)."""
    if DOT_IN_FP32:
        zero_q, zero_k = tl.zeros([s.shape[0], 16], dtype=tl.float32), tl.zeros([16, s.shape[1]], dtype=tl.float32)
    else:
        zero_q, zero_k = tl.zeros([s.shape[0], 16], dtype=q.dtype.element_ty), tl.zeros([16, s.shape[1]], dtype=q.dtype.element_ty)
    return tl.dot(zero_q, zero_k, acc=s, input_precision="ieee")


@jit(do_not_specialize=["L", "S"])  # not dependent: the module doc says why
def block_terms_kernel(
    q, v, slot_table, seq_ids, positions, maxima, scores, alphas, sums, pvs, L, S, stride_vs, stride_vh, stride_sb,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr, BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr, NB: tl.constexpr, MAX_CHUNK: tl.constexpr, INTERPRETED: tl.constexpr, STAGES: tl.constexpr,
):
    """Program (query i, KV head, c), over its run of blocks [lo, hi): the running maximum before block lo (the
    maximum of every earlier block's maxima: a maximum, exact in any order), then block by block that block's alpha,
    sum_j p and p · v as the walk computes them from the block's stored scores and its values, the running maximum
    carried on as the walk carries it; a row that sees no key of a block gets the terms that leave its state as the
    walk's select does (alpha 1, sums 0). q: only its element type, the walk's product's operand type."""
    i, kv_head = tl.program_id(0), tl.program_id(1)
    p_i, seq_row, full_blk, lo, hi = _program(i, tl.program_id(2), tl.num_programs(2), seq_ids, positions, slot_table, L,
                                               stride_sb, BLOCK_N)
    row_ok = tl.arange(0, ROWS) < G
    head_base = (i.to(tl.int64) * tl.num_programs(1) + kv_head) * NB
    # The walk's m before block lo: the earlier blocks' maxima, MAX_CHUNK blocks a load of [MAX_CHUNK, G_PAD] (-inf before
    # the first block).
    o_b = tl.arange(0, MAX_CHUNK)
    o_g = tl.arange(0, G_PAD)
    m_g = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    j0 = 0
    while j0 < lo:
        earlier = tl.load(maxima + (head_base + j0 + o_b[:, None]) * G_PAD + o_g[None, :], mask=j0 + o_b[:, None] < lo,
                          other=float("-inf"))
        m_g = tl.maximum(m_g, tl.max(earlier, 0))
        j0 += MAX_CHUNK
    # m_g laid out as the tile's rows (-inf in rows from G_PAD on), then carried along the run as the walk carries it;
    # as in `block_max_kernel`, blocks wholly below the row in a loop of their own (FULL), the row's last after them.
    rows = tl.arange(0, ROWS)
    m = tl.max(tl.where(rows[:, None] == o_g[None, :], m_g[None, :], float("-inf")), 1)
    mid = tl.maximum(tl.minimum(hi, full_blk), lo)
    m = _terms_loop(m, lo, mid, q, row_ok, p_i, full_blk, seq_row, kv_head, v, scores, alphas, sums, pvs, head_base, L, S, stride_vs,
                    stride_vh, G, G_PAD, ROWS, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT, INTERPRETED, STAGES, True)
    _terms_loop(m, mid, hi, q, row_ok, p_i, full_blk, seq_row, kv_head, v, scores, alphas, sums, pvs, head_base, L, S, stride_vs,
                stride_vh, G, G_PAD, ROWS, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT, INTERPRETED, STAGES, False)


@jit
def _terms_loop(m, a, b, q, row_ok, p_i, full_blk, seq_row, kv_head, v, scores, alphas, sums, pvs, head_base, L, S, stride_vs,
                stride_vh, G: tl.constexpr, G_PAD: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr, INTERPRETED: tl.constexpr, STAGES: tl.constexpr,
                FULL: tl.constexpr):
    """Blocks [a, b)'s terms in order (`_block_terms`), m carried; returns m after them."""
    if INTERPRETED:  # the interpreter cannot take a loaded bound in `range`
        i_blk = a
        while i_blk < b:
            m = _block_terms(m, _block_slots(i_blk * BLOCK_N, seq_row, L, BLOCK_N), q, row_ok, p_i, i_blk, full_blk, kv_head, v, scores,
                             alphas, sums, pvs, head_base, L, S, stride_vs, stride_vh, G, G_PAD, ROWS, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT,
                             FULL)
            i_blk += 1
    else:
        for i_blk in tl.range(a, b, num_stages=STAGES):
            m = _block_terms(m, _block_slots(i_blk * BLOCK_N, seq_row, L, BLOCK_N), q, row_ok, p_i, i_blk, full_blk, kv_head, v, scores,
                             alphas, sums, pvs, head_base, L, S, stride_vs, stride_vh, G, G_PAD, ROWS, D, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT,
                             FULL)
    return m


@jit
def _fold_block(l, acc, alphas, sums, pvs, at, keep, o_d, D: tl.constexpr):
    """One block's stored terms folded into l and acc by the walk's `_fold_sums`."""
    alpha = tl.load(alphas + at, mask=keep, other=1.0)
    return _fold_sums(l, acc, alpha, tl.load(sums + at, mask=keep, other=0.0),
                      tl.load(pvs + at[:, None] * D + o_d[None, :], mask=keep[:, None], other=0.0))


@jit
def _fold_blocks(l, acc, alphas, sums, pvs, head_base, i_blk, hi_blk, rows, keep, o_d, G_PAD: tl.constexpr, D: tl.constexpr,
                 UNROLL: tl.constexpr, MASKED: tl.constexpr):
    """Blocks [i_blk, i_blk + UNROLL) folded in order; MASKED: those from hi_blk on as no-ops (`_fold_row`)."""
    for u in tl.static_range(UNROLL):
        at = (head_base + i_blk + u) * G_PAD + rows
        l, acc = _fold_block(l, acc, alphas, sums, pvs, at, keep & (i_blk + u < hi_blk) if MASKED else keep, o_d, D)
    return l, acc


@jit(do_not_specialize=["L"], dependent=True)
def fold_kernel(
    o, positions, alphas, sums, pvs, L, stride_ot, stride_oh,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PART: tl.constexpr, BLOCK_N: tl.constexpr, NB: tl.constexpr,
    INTERPRETED: tl.constexpr, STAGES: tl.constexpr, UNROLL: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (query i, KV head, c): l and acc's columns [c * D_PART, (c + 1) * D_PART) over the row's blocks in
    ascending order, then the walk's zero select and division. Each element of acc is its own chain of multiply-adds,
    so splitting the columns over programs leaves every one's order, and l (recomputed by each) is the same chain.
    The loop's loads do not depend on the fold, so it is software-pipelined (STAGES blocks' terms in flight, copied
    asynchronously): otherwise each block would wait out a load's latency."""
    after_upstream(PDL)
    i, kv_head = tl.program_id(0), tl.program_id(1)
    hi_blk = _row_blocks(tl.load(positions + i).to(tl.int32), L, BLOCK_N)
    head_base = (i.to(tl.int64) * tl.num_programs(1) + kv_head) * NB
    _fold_row(o, i, kv_head, hi_blk, head_base, alphas, sums, pvs, stride_ot, stride_oh, tl.program_id(2) * D_PART, G, G_PAD, D,
              D_PART, INTERPRETED, STAGES, UNROLL)


@jit
def _fold_row(o, i, kv_head, hi_blk, head_base, alphas, sums, pvs, stride_ot, stride_oh, d0, G: tl.constexpr, G_PAD: tl.constexpr,
              D: tl.constexpr, D_PART: tl.constexpr, INTERPRETED: tl.constexpr, STAGES: tl.constexpr, UNROLL: tl.constexpr):
    """Query i's rows of KV head `kv_head`, columns [d0, d0 + D_PART): l and acc folded over its hi_blk blocks' stored
    terms in ascending order, then the walk's zero select and division, stored."""
    rows = tl.arange(0, G_PAD)
    o_d = d0 + tl.arange(0, D_PART)
    keep = rows < G
    l = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D_PART], dtype=tl.float32)
    # UNROLL blocks an iteration, their loads issued together: the whole iterations with no mask but the rows' (none
    # where G = G_PAD), then the row's last blocks as one iteration with a mask a block (the same multiply-adds,
    # `fma.rn.f32`, in the same order as a mask on every block, with fewer instructions). A block past the row's last
    # reads alpha 1 and zero sums, which leave l and acc as they are (a -0.0 in acc may turn +0.0, which `_finish` does
    # to every zero).
    whole = hi_blk // UNROLL * UNROLL
    if INTERPRETED:  # the interpreter cannot take a loaded bound in `range`
        i_blk = 0
        while i_blk < whole:
            l, acc = _fold_blocks(l, acc, alphas, sums, pvs, head_base, i_blk, whole, rows, keep, o_d, G_PAD, D, UNROLL, False)
            i_blk += UNROLL
        while i_blk < hi_blk:
            l, acc = _fold_blocks(l, acc, alphas, sums, pvs, head_base, i_blk, hi_blk, rows, keep, o_d, G_PAD, D, UNROLL, True)
            i_blk += UNROLL
    else:
        for i_blk in tl.range(0, whole, UNROLL, num_stages=STAGES):
            l, acc = _fold_blocks(l, acc, alphas, sums, pvs, head_base, i_blk, whole, rows, keep, o_d, G_PAD, D, UNROLL, False)
        if whole < hi_blk:
            l, acc = _fold_blocks(l, acc, alphas, sums, pvs, head_base, whole, hi_blk, rows, keep, o_d, G_PAD, D, UNROLL, True)
    _, out = _finish(l, acc)
    head = kv_head * G + rows
    tl.store(o + i.to(tl.int64) * stride_ot + head[:, None] * stride_oh + o_d[None, :], out.to(o.dtype.element_ty), mask=keep[:, None])


def applies(num_tokens: int, num_kv_heads: int, table_blocks: int, device: torch.device) -> bool:
    """Whether a decode call (one program per query and KV head in `attention_fwd`) takes the key blocks spread over
    the grid: BLOCKS_MIN set, its table at least that many blocks wide, and few programs an SM."""
    if BLOCKS_MIN is None or table_blocks < BLOCKS_MIN:
        return False
    if device.type != "cuda":
        return True
    return num_tokens * num_kv_heads <= BLOCKS_MAX_FILL * _num_sms(device)


def _programs_a_row(kernel, waves: int | None, args: tuple, options: dict, rows: int, blocks: int, device: torch.device) -> int:
    """Programs a row's blocks are dealt to by `kernel` launched with `args` and `options` (program c takes the c-th run
    of cdiv(blocks, P)): about `waves` programs an SM over all the call's rows, or where None as many as one SM holds
    (`_resident`), at most one a block of the table, so that a table wider than the rows' keys (an engine's, sized for
    its longest sequence) does not launch a program for every block of it. Off a GPU, waves - 1 (3 where None), so that
    the interpreter's tests deal several blocks to a program."""
    if device.type != "cuda":
        return min(blocks, max(1, (waves or 4) - 1))
    if waves is None:
        waves = _resident(kernel, args, options, device)
    return max(1, min(blocks, cdiv(waves * _num_sms(device), rows)))


_RESIDENT: dict[tuple, int] = {}  # (kernel, device, q's dtype, options) -> programs an SM holds


def _resident(kernel, args: tuple, options: dict, device: torch.device) -> int:
    """How many programs of `kernel`, compiled for `args` and `options`, one SM of `device` holds at once
    (`programs_that_fit`). Compiled here on the first call of a key, as its first launch would. The key is what decides
    the code (the constexprs, the operand type), not every argument's specialization as a launch's is: this runs on
    every eager decode call, and the answer only sizes the grid, which no bit depends on."""
    key = (kernel.fn.__name__, device, args[0].dtype, tuple(options.items()))
    if key not in _RESIDENT:
        compiled = kernel.warmup(*args, grid=(1,), **options)
        compiled = compiled.result() if hasattr(compiled, "result") else compiled
        compiled._init_handles()  # loads the binary, which reports its registers
        props = torch.cuda.get_device_properties(device)
        sm = (props.regs_per_multiprocessor, props.max_threads_per_multi_processor, props.shared_memory_per_multiprocessor)
        _RESIDENT[key] = programs_that_fit(compiled.n_regs, compiled.metadata.num_warps, compiled.metadata.shared, sm)
    return _RESIDENT[key]


def programs_that_fit(registers: int, warps: int, shared: int, sm: tuple[int, int, int]) -> int:
    """Programs of `warps` warps, `registers` a thread and `shared` bytes of shared memory that an SM of `sm` (registers,
    threads, shared memory bytes) holds at once: a warp's registers are allocated 256 at a time, and the hardware keeps
    1 KB of shared memory a program beside a program's own. At least 1."""
    sm_registers, sm_threads, sm_shared = sm
    fits = [sm_registers // (cdiv(registers * 32, 256) * 256 * warps), sm_threads // (32 * warps)]
    if shared:
        fits.append(sm_shared // (shared + 1024))
    return max(1, min(fits))


def _fold_programs(rows: int, head_dim: int, device: torch.device) -> tuple[int, int]:
    """(programs a (query, KV head) row, warps a program) for the fold: FOLD_SPLIT programs of FOLD_WARPS warps, or,
    on a GPU where the call's rows are few, twice as many again while rows x programs stays within the SMs, up to
    FOLD_MAX_SPLIT programs (and no more than head_dim) of one warp each."""
    split = FOLD_SPLIT
    if device.type == "cuda":
        while split * 2 <= min(FOLD_MAX_SPLIT, head_dim) and rows * split * 2 <= _num_sms(device):
            split *= 2
    return split, FOLD_WARPS if split == FOLD_SPLIT else 1


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_tile(q: Tensor, k_store: Tensor, block_m: int) -> tuple[int, int, int]:
    """A decode call's query heads per KV head, that rounded up to a power of two, and the rows of `attention_fwd`'s
    tile of one query."""
    group = q.shape[1] // k_store.shape[1]
    g_pad = next_power_of_2(group)
    return group, g_pad, max(16, max(1, block_m // g_pad) * g_pad)


def attention_decode(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor, scale: float,
                     o: Tensor, block_m: int, block_n: int, num_warps: int, num_stages: int) -> Tensor:
    """`attention_fwd`'s decode rows (no window, no log-sum-exp) into `o`, by the three kernels above."""
    num_tokens, _, head_dim = q.shape
    num_kv_heads = k_store.shape[1]
    group, g_pad, rows = decode_tile(q, k_store, block_m)
    table = slot_table.shape[1]
    nb = next_power_of_2(cdiv(table, block_n))
    maxima = q.new_empty((num_tokens, num_kv_heads, nb, g_pad), dtype=torch.float32)
    alphas, sums = torch.empty_like(maxima), torch.empty_like(maxima)
    pvs = q.new_empty((num_tokens, num_kv_heads, nb, g_pad, head_dim), dtype=torch.float32)
    scores = q.new_empty((num_tokens, num_kv_heads, nb, g_pad, block_n), dtype=torch.float32)
    interpret = triton_support.interpreting()
    tile = dict(G=group, G_PAD=g_pad, D=head_dim, DOT_IN_FP32=interpret, BLOCK_N=block_n, ROWS=rows, NB=nb, num_warps=num_warps,
                num_stages=num_stages)
    spread = (num_tokens * num_kv_heads, cdiv(table, block_n), q.device)
    args = (q, k_store, slot_table, seq_ids, positions, maxima, scores, table, k_store.shape[0], float(scale), q.stride(0), q.stride(1),
            k_store.stride(0), k_store.stride(1), slot_table.stride(0))
    options = tile | dict(RUN=MAX_RUN, AHEAD=MAX_SLOTS_AHEAD)
    block_max_kernel[(num_tokens, num_kv_heads, _programs_a_row(block_max_kernel, MAX_PROGRAM_WAVES, args, options, *spread))](*args, **options)
    args = (q, v_store, slot_table, seq_ids, positions, maxima, scores, alphas, sums, pvs, table, k_store.shape[0], v_store.stride(0),
            v_store.stride(1), slot_table.stride(0))
    options = tile | dict(SUM_BY_DOT=q.dtype == torch.float32 and not interpret, MAX_CHUNK=min(nb, MAX_CHUNK), INTERPRETED=interpret,
                          STAGES=BLOCK_STAGES)
    block_terms_kernel[(num_tokens, num_kv_heads, _programs_a_row(block_terms_kernel, PROGRAM_WAVES, args, options, *spread))](*args, **options)
    split, fold_warps = _fold_programs(num_tokens * num_kv_heads, head_dim, q.device)
    d_part = max(1, head_dim // split)
    fold_kernel[(num_tokens, num_kv_heads, head_dim // d_part)](o, positions, alphas, sums, pvs, table, o.stride(0), o.stride(1),
                                                                G=group, G_PAD=g_pad, D=head_dim, D_PART=d_part, BLOCK_N=block_n,
                                                                NB=nb, INTERPRETED=interpret, STAGES=FOLD_STAGES,
                                                                UNROLL=FOLD_UNROLL, num_warps=fold_warps)
    return o
