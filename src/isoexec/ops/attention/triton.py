"""Batch-invariant causal GQA attention as one Triton kernel for training, prefill chunks and decode.

The kernel takes the same integer metadata as `reference.attention` (slot table, sequence ids,
absolute positions; see `metadata.py`), so the packed training batch, a chunk of a prefill and one
decode token per sequence over the paged cache are the same launch with different integers.

A tile is a run of at most BLOCK_Q queries of one sequence at consecutive positions inside one
absolute block of BLOCK_Q positions, with all G = H / Hkv query heads that read one KV head: its
BLOCK_Q * G rows share every key and value load. The contract's `block_m` counts those rows:
BLOCK_Q = max(1, block_m // G) (G rounded up to a power of two), so `block_m = 64` gives 64-row MMA
tiles for any head grouping. A decode query is a tile of its own, in a 64-row tile like every other:
rows of different MMA shapes (mma.sync for 16 rows, wgmma for 64) differ in the last bits on an H200
at head_dim 128, so the tile shape is one constant for every case. A tile walks the absolute key
blocks [j * BLOCK_N, (j + 1) * BLOCK_N) in ascending order, from the first block any of its rows can
see to the last, gathering each key's row of the store through the slot table. Per block and row, in
fp32:

    s = (q · k) * scale              tl.dot, bf16 operands, fp32 accumulation; the product by scale rounded
                                     on its own (mul.rn); -inf where not visible
    m' = max(m, max_j s)             a row that has seen no key yet uses 0 in place of -inf below
    p = exp(s - m'),  alpha = exp(m - m')   exp(x) = ex2.approx.ftz(x * log2 e): +0 below 2^-126
    l' = l * alpha + sum_j p
    acc' = acc * alpha + (p · v)     p rounded to kv_cache_dtype
    (m, l, acc) <- (m', l', acc') only for rows that see a key of this block

and finally out = acc / l (0 for a row that saw no key; a zero acc taken as +0.0), rounded once. What
a row computes depends only on its query, its visible keys and values, and its absolute position:
which other rows share its tile, where in the tile it sits (every row of the MMA tile is reduced the
same way; the battery checks it), how the keys are laid out in the store, and which blocks the other
rows needed do not enter. A block the row does not see leaves its state untouched (selected, not
added), and a zero accumulator is read as +0.0, since keys the row does not see but a neighbour does
add 0 * v terms whose sign would otherwise depend on the neighbours. That select runs once, before the
division: a sum of two floats depends on a zero's sign only when both are zero, so acc carries the same
values whether zeros are made +0.0 after every block or only at the end, up to the sign of a zero acc.
One limit: a key visible to a neighbour whose value is inf or NaN gives 0 * inf = NaN in this row too;
the engine and trainer only ever expose written (finite) keys to any row.

With `split_kv_size` S > 0 the walk restarts from (-inf, 0, 0) at every absolute span of S keys, and the tile keeps
the spans' states combined in ascending order beside the open span's (`triton_steps._walk`, `_combine`; the op order
is in README.md, "Spans"); a decode call runs its spans in programs of their own and combines them in a second launch
(`triton_spans.py`), and a call whose table is no wider than one span runs as if S were 0 (the same bits).

Blocks wholly below the tile's first position (most of a long row's walk) are visible to every row
alike, so `_full_block` runs them without the per-row masks and their reductions; a tile first checks that every
slot of those blocks lies in the store (`_slots_in_store`) and then drops the per-key checks too (a table with a slot
outside walks them masked). Both walks gather
through `_gather_kv` and update through `_update`, the one copy of the arithmetic, on the same values,
so a row's bits do not depend on which walk a block took (a decode row takes `_full_block` for blocks a
training tile's row gets through `_block`). Compiled for sm_90, the split into these helpers left the
kernel's floating-point instructions as they were (the PTX differs only in the order of integer
address arithmetic).

The grid has one program per BLOCK_Q consecutive queries (one per query in a decode batch) and KV
head, last queries first (they see the most keys). A program finds the tiles that start among its
queries (the first query, or one whose sequence differs from the previous query's, whose position does
not follow it, or that opens an absolute block of BLOCK_Q positions), reads each tile's extent from the
metadata itself and runs them in turn, so there is no host sync and no separate tiling kernel, and decode steps can be captured in
a CUDA graph. On Hopper a batch of many queries runs two 64-row tiles stacked in one program of two
warpgroups (`attention_fwd`): rows keep their MMA and so their bits. A visible key whose slot lies
outside the store is skipped rather than reported (the kernel cannot raise); `reference.attention`
raises there.

The backward pass of a packed batch (`packed_len`, the trainer's) takes flash's varlen backward over the
Triton output and each row's log-sum-exp, which the forward writes for it (`flash_backward.py`); any
other batch recomputes the forward with `native.attention` (SDPA) under autograd. Gradients are correct,
not batch-invariant.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..common import ALL_CASES, torch_dtype
from ..triton_support import after_upstream, cdiv, jit, needs_grad, next_power_of_2, prefetch, require_device, tl, triton_available
from . import flash_backward, gluon_tile, native, triton_blocks, triton_spans
from .triton_steps import (_block, _close_span, _combine, _diagonal_block, _finish, _fold, _full_block, _full_block_pair, _gather_kv,
                           _gather_v, _in_range, _in_store, _masked_block, _probs_times_v, _products, _row_sum, _running_max, _scores,
                           _slots_in_store, _update, _visible, _walk)
from .reference import _check_inputs, check_split

ID = "attention.triton"
DTYPES = ("bfloat16", "float16", "float32")

# Hopper (H100/H200) constants for bf16 head_dim 128 models, as the tiny-dense-triton preset pins them
# for every case: 64-row tiles (one warpgroup), three load stages (benchmarks/profile_gpu.py attention;
# docs/experiments.md). block_n = 32 (it decides bits): the largest key block that divides the preset's
# 32-token pages.
HOPPER_CONSTANTS = dict(input_dtype="bfloat16", output_dtype="bfloat16", kv_cache_dtype="bfloat16", accum_dtype="float32",
                        block_m=64, block_n=32, num_warps=4, num_stages=3, split_kv_size=0)


# Whole key blocks two at a time where a tile takes them (`attention_fwd`); False walks them one by one, the same bits
# (for measuring pairs).
PAIRS = True
# A tile first checks that every slot its whole key blocks read lies in the store, then walks them without per-key
# masks (`triton_steps._slots_in_store`; the same bits). For a decode program too (CHECK_DECODE_SLOTS): on an H100 the
# check's round trip cost less than the masks at batch 16-64 (benchmarks/RESULTS.md). The spread decode
# (`triton_blocks.py`) keeps its masks. False masks those tiles (for measuring).
CHECK_SLOTS = True
CHECK_DECODE_SLOTS = True
# With the check reaching the tile's last visible key, the blocks of the tile's own positions walk without slot compares
# or reductions over the block (`triton_steps._diagonal_block`; the same values). Compiled for sm_90a at Qwen3-8B's heads
# (benchmarks/attention_sass.py) that step is ~510 SASS instructions a warp against `_block`'s ~945 and its set-up ~165
# against ~505 in the stacked prefill tile; in the decode tile ~530 and ~240 against ~1,030 and ~650, though its pairs
# of whole blocks grow 654 -> 695. On an H100 (one call, benchmarks/RESULTS.md) both on took prefill at 2,048 / 8,192
# tokens from 0.198 / 2.139 ms to 0.186 / 2.051 and decode at batch 64 x 512 keys from 77.7 to 75.1 us, and left batch
# 16-64 at 2,048-8,192 keys within 1%. For tiles of many queries (CHECK_DIAGONAL) and decode programs
# (CHECK_DECODE_DIAGONAL); False walks those blocks by the masked step (for measuring).
CHECK_DIAGONAL = True
CHECK_DECODE_DIAGONAL = True
# A tile over spans holds a second accumulator (the spans' total) through its walk. Compiled for sm_90a at Qwen3-8B's
# heads (benchmarks/sm90.py), a stacked tile then spills 484 bytes a thread with pairs of blocks and 124 without (40
# and 0 without spans); a one-query tile 476 and 108 (108 and 108). `triton_spans.span_kernel` walks one span and
# holds no total: it takes pairs.
PAIRS_WITH_SPANS = False
# Programs go out to the SMs in launch order. HEADS_FASTEST numbers them so that the last query ranges of every KV head
# come first, then the ranges before them: the longest walks of a causal batch first across the whole call, not head
# by head (False: each KV head's ranges in turn, longest first). Which program runs a tile never enters a row's bits.
# On an H100 (graph replays, one call, benchmarks/RESULTS.md) it took one sequence's prefill at Qwen3-8B's heads from
# 0.077 to 0.056 ms at 1,024 tokens and 0.189 to 0.164 at 2,048, 8 x 512 from 0.151 to 0.140, the head_dim-256
# attention of the Qwen3.5 presets 0.461 to 0.336 ms at 2,048; one wave (512 tokens) or many (8,192) moved within 2%.
HEADS_FASTEST = True
# A program's first key block waits on three round trips to memory one after the other: the metadata that finds its
# tiles, then its query rows and the slot table (the check that its whole blocks' slots lie in the store), then the
# keys and values. PREFETCH_PROLOGUE asks for the candidate queries' rows (L2) before the metadata comes back, and for
# the table row of the last candidate's sequence (L1, up to 64 lines) as soon as it does: hints, which no value depends
# on (compiled for sm_90a the floating-point instructions are the same sequence with it and without). On an H100 (graph
# replays, two calls, benchmarks/RESULTS.md): prefill 8 x 512 0.141 -> 0.138-0.139 ms, 512 tokens 0.78 -> 0.79-0.80 of
# flash, 8,192 2.058 -> 2.049; decode 64 x 512 75.2-75.4 -> 73.3-73.4 us, 64 x 2,048 213.3 -> 211.5.
PREFETCH_PROLOGUE = True


@jit
def _tile(
    i, q, k, v, o, lse, slot_table, seq_ids, positions, kv_head,
    T, L, S, scale, window,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_sb, stride_lh,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    SUM_BY_DOT: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, PAIRED: tl.constexpr,
    WITH_LSE: tl.constexpr, SPAN: tl.constexpr, CHECKED: tl.constexpr, DIAGONAL: tl.constexpr,
):
    """The tile that starts at query i: its queries' rows, every key block they see, their outputs."""
    seq = tl.load(seq_ids + i)
    rows = tl.arange(0, ROWS)  # BLOCK_Q * G_PAD rows, padded up to tl.dot's 16
    t = rows // G_PAD
    tok = i + t  # [ROWS]
    in_range = tok < T
    s_tok = tl.load(seq_ids + tok, mask=in_range, other=-1)
    p_tok = tl.load(positions + tok, mask=in_range, other=-1)
    p_prev = tl.load(positions + tok - 1, mask=in_range & (t > 0), other=-1)
    cut = (t > 0) & (~in_range | (s_tok != seq) | (p_prev + 1 != p_tok) | (p_tok % BLOCK_Q == 0))
    length = tl.min(tl.where(cut, t, BLOCK_Q), 0)
    row_ok = (t < length) & (rows < BLOCK_Q * G_PAD) & (rows % G_PAD < G)
    head = kv_head * G + rows % G_PAD
    tok = tl.where(row_ok, tok, i).to(tl.int64)
    pos = tl.where(row_ok, p_tok, -1).to(tl.int32)
    o_d = tl.arange(0, D)
    p_q = q + tok[:, None] * stride_qt + head[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=row_ok[:, None], other=0.0)
    if DOT_IN_FP32:
        b_q = b_q.to(tl.float32)

    # The blocks holding any row's visible keys: [lo_blk, hi_blk); other blocks would be no-ops. Without
    # a window, those below every row's position (the tile's first) and inside the table are whole:
    # [lo_blk, full_blk) take `_full_block`, the rest `_block`, in ascending order either way.
    hi = tl.max(tl.where(row_ok, tl.minimum(pos, L - 1), -1), 0)
    lo = 0
    if HAS_WINDOW:
        lo = tl.min(tl.where(row_ok, tl.maximum(pos - window + 1, 0), hi), 0)
    lo_blk = lo // BLOCK_N
    hi_blk = tl.where(hi >= 0, hi // BLOCK_N + 1, lo_blk)
    full_blk = lo_blk
    diag_hi = -1
    seq_row = slot_table + seq.to(tl.int64) * stride_sb
    if not HAS_WINDOW:
        full_blk = (tl.minimum(tl.load(positions + i), L - 1).to(tl.int32) + 1) // BLOCK_N
        # CHECKED: once the slots of its whole blocks are found in the store (2,048 slots a step of the check), they walk
        # without per-key masks; DIAGONAL: the check reaches the tile's last visible key, and the blocks of the tile's
        # own positions walk without slot compares (`_diagonal_block`). A tile whose table has a slot outside it there
        # (never in the engine or trainer) walks every block masked, the same bits.
        if CHECKED:
            if not _slots_in_store(seq_row, lo_blk * BLOCK_N, hi + 1 if DIAGONAL else full_blk * BLOCK_N, S, 2048):
                full_blk = lo_blk
            elif DIAGONAL:
                diag_hi = hi

    m, l, acc = _walk(b_q, pos, row_ok, lo_blk, full_blk, hi_blk, diag_hi, seq_row, kv_head, k, v, L, S, scale, window, stride_ks,
                      stride_kh, stride_vs, stride_vh, HAS_WINDOW, D, BLOCK_N, ROWS, DOT_IN_FP32, SUM_BY_DOT, PAIRED, SPAN, CHECKED,
                      DIAGONAL)

    has_keys, out = _finish(l, acc)
    p_o = o + tok[:, None] * stride_ot + head[:, None] * stride_oh + o_d[None, :]
    tl.store(p_o, out.to(o.dtype.element_ty), mask=row_ok[:, None])
    if WITH_LSE:  # flash's convention: +inf for a row that saw no key, so a backward's exp(s - lse) is 0 there
        row_lse = tl.where(has_keys, m + tl.log(tl.where(has_keys, l, 1.0)), float("inf"))
        tl.store(lse + head.to(tl.int64) * stride_lh + tok, row_lse, mask=row_ok)


@jit
def _prefetch_queries(q, tok, kv_head, stride_qt, stride_qh, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                      INTERPRETED: tl.constexpr):
    """Asks for the rows of queries `tok` ([QUERIES], inside the batch) at every head of KV head `kv_head` to be brought
    into L2, while the metadata that says which of them start a tile comes back (`PREFETCH_PROLOGUE`)."""
    LINE: tl.constexpr = 1024 // q.dtype.element_ty.primitive_bitwidth  # elements a 128-byte line
    LINES: tl.constexpr = (D + LINE - 1) // LINE
    head = kv_head * G + tl.minimum(tl.arange(0, G_PAD), G - 1)
    rows = tok.to(tl.int64)[:, None] * stride_qt + head[None, :] * stride_qh  # [QUERIES, G_PAD]
    prefetch(q + rows[:, :, None] + (tl.arange(0, LINES) * LINE)[None, None, :], True, INTERPRETED)


@jit
def _prefetch_table_row(slot_table, stride_sb, seq_c, pos_c, c, valid, L, INTERPRETED: tl.constexpr):
    """Asks for the slot table's row of the last valid candidate query's sequence, from key 0 to its position (its first
    64 lines at most; the addresses clamped to the row, none asked for from a table without keys), to be brought into
    L1, where the tile's slot check and first blocks read it (`PREFETCH_PROLOGUE`)."""
    PER_LINE: tl.constexpr = 1024 // slot_table.dtype.element_ty.primitive_bitwidth  # slots a 128-byte line
    if L > 0:
        last = tl.max(tl.where(valid, c, -1), 0)
        seq = tl.max(tl.where(c == last, seq_c, -1), 0)
        hi = tl.minimum(tl.max(tl.where(c == last, pos_c, 0), 0), L - 1)
        keys = tl.maximum(tl.minimum(tl.arange(0, 64) * PER_LINE, hi), 0)
        prefetch(slot_table + tl.maximum(seq, 0).to(tl.int64) * stride_sb + keys, False, INTERPRETED)


@jit(do_not_specialize=["T", "L", "S", "window"], dependent=True)
def attention_fwd_kernel(
    q, k, v, o, lse, slot_table, seq_ids, positions,
    T, L, S, scale, window,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_sb, stride_lh,
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    D: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    SUM_BY_DOT: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    QUERIES: tl.constexpr,
    PAIRED: tl.constexpr,
    WITH_LSE: tl.constexpr,
    SPAN: tl.constexpr,
    CHECKED: tl.constexpr,
    DIAGONAL: tl.constexpr,
    HEADS_FASTEST: tl.constexpr = False,
    PROLOGUE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    after_upstream(PDL)
    # Program (r, kv_head) runs, in order, the tiles that start among queries [r * QUERIES, (r + 1) *
    # QUERIES): a tile is a run of queries of one sequence at consecutive positions inside one absolute
    # block of BLOCK_Q positions, and starts where a query's sequence or position breaks the run. The
    # last queries go first: in a causal batch they see the most keys (with HEADS_FASTEST, those of every KV head).
    if HEADS_FASTEST:  # (r, kv_head) read from the launch's linear order with kv_head fastest
        heads = tl.num_programs(1)
        launched = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
        r, kv_head = tl.num_programs(0) - 1 - launched // heads, launched % heads
    else:
        r, kv_head = tl.num_programs(0) - 1 - tl.program_id(0), tl.program_id(1)
    c = tl.arange(0, QUERIES)
    cand = r * QUERIES + c
    valid = cand < T
    has_prev = valid & (cand > 0)
    if PROLOGUE:
        _prefetch_queries(q, tl.minimum(cand, T - 1), kv_head, stride_qt, stride_qh, G, G_PAD, D, DOT_IN_FP32)
    seq_c = tl.load(seq_ids + cand, mask=valid, other=-1)
    pos_c = tl.load(positions + cand, mask=valid, other=-1)
    seq_p = tl.load(seq_ids + cand - 1, mask=has_prev, other=-1)
    pos_p = tl.load(positions + cand - 1, mask=has_prev, other=-1)
    if PROLOGUE:
        _prefetch_table_row(slot_table, stride_sb, seq_c, pos_c, c, valid, L, DOT_IN_FP32)
    starts = valid & ((cand == 0) | (seq_p != seq_c) | (pos_p + 1 != pos_c) | (pos_c % BLOCK_Q == 0))
    start = tl.min(tl.where(starts, c, QUERIES), 0)
    while start < QUERIES:
        _tile(r * QUERIES + start, q, k, v, o, lse, slot_table, seq_ids, positions, kv_head, T, L, S, scale, window,
              stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh, stride_sb, stride_lh,
              G, G_PAD, D, HAS_WINDOW, DOT_IN_FP32, SUM_BY_DOT, BLOCK_Q, BLOCK_N, ROWS, PAIRED, WITH_LSE, SPAN, CHECKED, DIAGONAL)
        start = tl.min(tl.where(starts & (c > start), c, QUERIES), 0)


def attention_fwd(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor, scale: float,
                  window: int | None, out_dtype: torch.dtype, block_m: int, block_n: int, num_warps: int,
                  num_stages: int, split_kv_size: int = 0, lse: Tensor | None = None) -> Tensor:
    """q [T, H, D], k_store / v_store [S, Hkv, D] -> [T, H, D] in `out_dtype`; with `lse` [H, T] float32, each
    row's log-sum-exp of its scaled scores is written there too (a flash backward's input; no bit of the
    output depends on it). split_kv_size > 0: each row's walk restarts every split_kv_size keys (absolute
    spans), the spans' states combined in ascending order."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_store.shape[1]
    o = q.new_empty(q.shape, dtype=out_dtype)
    if num_tokens == 0 or num_heads == 0:
        return o
    group = num_heads // num_kv_heads
    g_pad = next_power_of_2(group)
    tile_positions = max(1, block_m // g_pad)
    # Which program runs a tile never enters a row's bits. A batch with no more queries than sequences
    # (decode) gets one program per query: in a range of several, each query would be its own tile, run
    # one after another.
    queries = 1 if num_tokens <= slot_table.shape[0] else tile_positions
    rows = max(16, tile_positions * g_pad)
    # A batch of many queries (training, prefill) runs two of the contract's tiles per program where that
    # tile is one Hopper warpgroup (64 rows, 4 warps, 16-bit operands) at head_dim <= 128: 128 rows over 8
    # warps, each warpgroup on its own 64 rows with the same wgmma, so every row keeps its bits (on an
    # H200, by sha-256 against the lone tile, docs/experiments.md), and each key block's loads serve twice
    # the rows. Only while the pair spans at most one key block of positions: beyond that the rows' causal
    # walks part by more than a block, and on an H200 32 x 512 tokens at 2 heads per KV head ran 8% slower.
    # Not with a window, which no measurement covered. Nor where the tile runs in Gluon (`gluon_tile.py`): there lone
    # 64-row tiles ran faster than stacked ones on an H100.
    stacked = (queries > 1 and rows == 64 and num_warps == 4 and 2 * tile_positions <= block_n and head_dim <= 128
               and window is None and q.dtype != torch.float32 and _warpgroup_mma(q.device)
               and not gluon_tile.applies(rows, num_warps, head_dim, window, q.dtype, q.device))
    if stacked:
        tile_positions, rows, num_warps = 2 * tile_positions, 128, 8
        queries = tile_positions
    # A row within its first span has the one-pass walk's bits (`triton_steps._walk`: that span's state, combined into
    # the empty total, comes back as it is), so a call whose table is no wider than a span runs as if without spans,
    # with every path that has.
    span = split_kv_size // block_n
    if cdiv(slot_table.shape[1], block_n) <= span:
        span = 0
    # Whole key blocks are walked two at a time (`_full_block_pair`, the same operations in the same order)
    # in the one-query form and in stacked tiles. A lone 64-row tile of many queries spills with both
    # blocks' scores at 4 warps: on one H200 pairs ran 0.86x as fast there for 300- and 512-token sequences.
    # With spans, a tile takes pairs only where PAIRS_WITH_SPANS says (the constant's comment), and a pair never
    # straddles a span's end: pairs start at even blocks, so only in spans of an even number of blocks.
    paired = PAIRS and (queries == 1 or stacked) and (not span or (PAIRS_WITH_SPANS and span % 2 == 0))
    q, k_store, v_store = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_store, v_store))
    slot_table = slot_table.contiguous()
    # A decode call over spans walks each row's spans in programs of their own and combines them in a second launch
    # (`triton_spans.py`: the same walk and combine).
    if span and triton_spans.ENABLED and queries == 1 and window is None and lse is None:
        return triton_spans.attention_decode(q, k_store, v_store, slot_table, seq_ids.contiguous(), positions.contiguous(), scale, o,
                                             block_m, block_n, num_warps, num_stages, span)
    # A decode call of few programs may spread each row's key blocks over the grid (`triton_blocks.py`: the same
    # block steps and fold, in three launches).
    if not span and queries == 1 and window is None and lse is None and triton_blocks.applies(num_tokens, num_kv_heads, cdiv(slot_table.shape[1], block_n),
                                                                                   q.device):
        return triton_blocks.attention_decode(q, k_store, v_store, slot_table, seq_ids.contiguous(), positions.contiguous(), scale, o,
                                              block_m, block_n, num_warps, num_stages)
    # On Hopper the tile may be the same tile written in Gluon (`gluon_tile.py`: the same operations in the same layouts),
    # where ISOEXEC_ATTENTION_GLUON=1.
    if not span and gluon_tile.applies(rows, num_warps, head_dim, window, q.dtype, q.device):
        return gluon_tile.attention_fwd(q, k_store, v_store, slot_table, seq_ids.contiguous(), positions.contiguous(), scale, o, lse,
                                        group, g_pad, tile_positions, queries, block_n, num_warps)
    checked = CHECK_SLOTS and (queries > 1 or CHECK_DECODE_SLOTS)
    attention_fwd_kernel[(cdiv(num_tokens, queries), num_kv_heads)](
        q, k_store, v_store, o, o if lse is None else lse, slot_table, seq_ids.contiguous(), positions.contiguous(),
        num_tokens, slot_table.shape[1], k_store.shape[0], float(scale), 0 if window is None else int(window),
        q.stride(0), q.stride(1), k_store.stride(0), k_store.stride(1), v_store.stride(0), v_store.stride(1), o.stride(0), o.stride(1),
        slot_table.stride(0), 0 if lse is None else lse.stride(0),
        G=group, G_PAD=g_pad, D=head_dim, HAS_WINDOW=window is not None,
        DOT_IN_FP32=triton_support.interpreting(), SUM_BY_DOT=q.dtype == torch.float32 and not triton_support.interpreting(),
        BLOCK_Q=tile_positions, BLOCK_N=block_n, ROWS=rows, QUERIES=queries, PAIRED=paired,
        WITH_LSE=lse is not None, SPAN=span, CHECKED=checked, DIAGONAL=checked and (CHECK_DIAGONAL if queries > 1 else CHECK_DECODE_DIAGONAL), HEADS_FASTEST=HEADS_FASTEST, PROLOGUE=PREFETCH_PROLOGUE, num_warps=num_warps, num_stages=num_stages,
    )
    return o


@functools.cache
def _warpgroup_mma(device: torch.device) -> bool:
    """Whether tl.dot runs as wgmma (Hopper) on this device."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k_store, v_store, slot_table, seq_ids, positions, scale, window, packed_len, dtypes, config):
        out_dtype = torch_dtype(dtypes["output_dtype"])
        # A packed batch (the trainer's) keeps each row's log-sum-exp for flash's backward
        # (`flash_backward.py`); any other batch's backward recomputes with attention.native.
        kept = flash_backward.fits(q, k_store, out_dtype, window, packed_len)
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if kept else None
        out = attention_fwd(q, k_store, v_store, slot_table, seq_ids, positions, scale, window, out_dtype, **config, lse=lse)
        ctx.save_for_backward(q, k_store, v_store, slot_table, seq_ids, positions, *((out, lse) if lse is not None else ()))
        ctx.scale, ctx.window, ctx.dtypes = scale, window, dtypes
        # Without flash's backward, a packed batch recomputes with one padded flash call (`native.packed`).
        ctx.longest = packed_len if window is None else None
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k_store, v_store, slot_table, seq_ids, positions, *kept = ctx.saved_tensors
        nothing = (None,) * 8
        if kept:
            dq, dk, dv = flash_backward.grads(grad, q, k_store, v_store, *kept, slot_table, seq_ids, positions, ctx.scale, ctx.longest)
            return (*(d if need else None for d, need in zip((dq, dk, dv), ctx.needs_input_grad[:3])), *nothing)
        inputs = [t.detach().requires_grad_(need) for t, need in zip((q, k_store, v_store), ctx.needs_input_grad[:3])]
        with torch.enable_grad():
            if ctx.longest is not None:
                out = native.packed(*inputs, slot_table, seq_ids, positions, ctx.scale, ctx.longest)
            else:
                out = native.attention(*inputs, slot_table, seq_ids, positions, ctx.scale, ctx.window, **ctx.dtypes)
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad.to(out.dtype)))
        return (*(next(grads) if t.requires_grad else None for t in inputs), *nothing)


def attention(q: Tensor, k_store: Tensor, v_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
              scale: float, window: int | None = None, packed_len: int | None = None, *, input_dtype: str, output_dtype: str,
              kv_cache_dtype: str, accum_dtype: str, block_m: int, block_n: int, num_warps: int, num_stages: int,
              split_kv_size: int) -> Tensor:
    """Same arguments and result as `reference.attention` (its docstring has the layout)."""
    check_constants(dict(accum_dtype=accum_dtype, input_dtype=input_dtype, kv_cache_dtype=kv_cache_dtype,
                         block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages, split_kv_size=split_kv_size))
    _check_inputs(q, k_store, v_store, slot_table, seq_ids, positions, window, input_dtype, kv_cache_dtype)
    head_dim = q.shape[2]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"{ID}: head_dim must be a power of two >= 16, got {head_dim}")
    require_device(ID, q, k_store, v_store, slot_table)
    config = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages, split_kv_size=split_kv_size)
    if needs_grad(q, k_store, v_store):
        dtypes = dict(input_dtype=input_dtype, output_dtype=output_dtype, kv_cache_dtype=kv_cache_dtype)
        return _TritonAttention.apply(q, k_store, v_store, slot_table, seq_ids, positions, scale, window, packed_len, dtypes, config)
    return attention_fwd(q, k_store, v_store, slot_table, seq_ids, positions, scale, window, torch_dtype(output_dtype), **config)


def bench_op(**overrides):
    """The op with its Hopper constants, for `benchmarks/`: (q, k_store, v_store, slot_table, seq_ids,
    positions, scale) -> out."""
    constants = {**HOPPER_CONSTANTS, **overrides}
    return lambda q, k_store, v_store, slot_table, seq_ids, positions, scale: attention(
        q, k_store, v_store, slot_table, seq_ids, positions, scale, **constants)


def check_constants(constants: dict) -> None:
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    for name in ("input_dtype", "kv_cache_dtype"):
        if constants[name] not in DTYPES:
            raise ValueError(f"{ID}: {name} must be one of {', '.join(DTYPES)} (tl.dot operands), got {constants[name]!r}")
    if constants["input_dtype"] != constants["kv_cache_dtype"]:
        raise ValueError(f"{ID}: input_dtype and kv_cache_dtype must match (one tl.dot operand type)")
    for name in ("block_m", "block_n"):
        value = constants[name]
        if value < 1 or value & (value - 1):
            raise ValueError(f"{ID}: {name} must be a power of two, got {value}")
    if constants["block_n"] < 16:
        raise ValueError(f"{ID}: block_n must be >= 16 (tl.dot's smallest tile), got {constants['block_n']}")
    check_split(ID, constants["split_kv_size"], constants["block_n"])
    if constants["num_warps"] not in (1, 2, 4, 8, 16) or constants["num_stages"] < 1:
        raise ValueError(f"{ID}: num_warps must be a power of two <= 16 and num_stages >= 1")


def check_geometry(constants: dict, geometry: dict) -> None:
    """A model whose head_dim this kernel cannot tile is refused when the contract is fitted to it."""
    head_dim = geometry.get("head_dim")
    if head_dim is not None and (head_dim < 16 or head_dim & (head_dim - 1)):
        raise ValueError(f"head_dim {head_dim}: {ID} needs a power of two >= 16")


def register(registry) -> None:
    """Register attention.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="attention", cases=ALL_CASES, fn=attention, check_constants=check_constants, check_geometry=check_geometry,
                               sources=(attention_fwd_kernel, _tile, _walk, _close_span, _combine, _full_block, _full_block_pair, _in_range, _in_store, _slots_in_store, _block, _masked_block, _diagonal_block,
                                        _update, _scores, _products, _running_max, _probs_times_v, _fold, _gather_kv, _gather_v, _row_sum, _visible, _finish,
                                        triton_support, triton_blocks.block_max_kernel, triton_blocks.block_terms_kernel,
                                        triton_blocks.fold_kernel, triton_spans.span_kernel, triton_spans.combine_kernel, gluon_tile)))
