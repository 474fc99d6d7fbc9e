"""Multi-head latent attention in the absorbed form as three Triton launches, one op order for
training, prefill chunks and decode (README.md has the design, its invariance argument and the constants).

1. `head_linear_kernel` takes q_nope into the latent space, q_lat[t, h] = W_UK[h]ᵀ q_nope[t, h]: per
   head a GEMM tile of `linear.triton`'s kind (`tile_triton`: fp32 accumulation over K in ascending
   blocks of BLOCK_K, no split-K, one tile for every M), reading W_UK[h]ᵀ as a strided view of
   kv_b_weight, rounded to input_dtype;
2. `mla_attn_fwd_kernel` runs MQA over the cached (latent, rope key) rows: every head reads the one
   shared key/value head, keys [c | k_rope], values c. attention.triton's tiles and block walk (tiles
   of consecutive queries of one sequence inside one absolute block of positions, absolute key blocks
   in ascending order, `_full_block` below the tile), with all heads of a query as rows of one MMA
   tile; the score is two `tl.dot`s into one fp32 accumulator (latent part, then rope part), and
   each key block's latent tile is loaded once for its score and its value. The latent output is
   rounded to input_dtype;
3. `head_linear_kernel` again brings it out, out[t, h] = W_UV[h] o_lat[t, h], rounded to output_dtype.

A row's bits depend only on its query, its sequence's cached rows and its absolute position: never on
T, the other rows, the case or the store's layout. Nothing waits on the host, so decode steps can be
captured in a CUDA graph. A visible key whose slot lies outside the store is skipped (a kernel cannot
raise; `reference` raises). The backward pass recomputes the forward with `native` (the decompressed
form) under autograd: correct gradients, not invariant ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...runtime.registry import Impl
from .. import triton_support
from ..attention.triton import _row_sum
from ..attention.triton_steps import _in_range
from ..common import ALL_CASES, torch_dtype
from ..linear import tile_triton
from ..linear.triton import SHARED_MEMORY_BYTES, pipeline_stages
from ..triton_support import cdiv, jit, needs_grad, next_power_of_2, require_device, tl, triton_available
from . import native, tuning
from .reference import check_inputs

ID = "mla.triton"
DTYPES = ("bfloat16", "float16", "float32")


@jit(do_not_specialize=["M"])
def head_linear_kernel(
    x, w, y,
    M, N,
    stride_xm, stride_xh, stride_xk, stride_wh, stride_wn, stride_wk, stride_ym, stride_yh, stride_yn,
    K: tl.constexpr, NK: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """y[m, i_h, n] = sum_k x[m, i_h, k] w[i_h, n, k] over tile (i_m, i_n): K in ascending blocks."""
    i_m, i_n, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    x += i_h.to(tl.int64) * stride_xh
    w += i_h.to(tl.int64) * stride_wh
    y += i_h.to(tl.int64) * stride_yh
    o_m = i_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_m, m_n = o_m < M, o_n < N
    b_acc = tl.full([BLOCK_M, BLOCK_N], 0.0, dtype=tl.float32)
    for i_k in range(0, NK):
        o_k = i_k * BLOCK_K + tl.arange(0, BLOCK_K)
        m_k = o_k < K
        b_x = tl.load(x + o_m[:, None] * stride_xm + o_k[None, :] * stride_xk, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_w = tl.load(w + o_k[:, None] * stride_wk + o_n[None, :] * stride_wn, mask=m_k[:, None] & m_n[None, :], other=0.0)
        b_acc = tile_triton.accumulate(b_x, b_w, b_acc, DOT_IN_FP32)  # [BLOCK_M, BLOCK_N]
    tile_triton.store_tile(b_acc, y, y, i_m, i_n, M, N, stride_ym, stride_yn, False, BLOCK_M, BLOCK_N, DOT_IN_FP32)


def head_linear(x: Tensor, w: Tensor, out_dtype: torch.dtype, *, block_m: int, block_n: int, block_k: int, num_warps: int,
                num_stages: int) -> Tensor:
    """x [M, H, K], w [H, N, K] (any strides) -> [M, H, N] in `out_dtype`."""
    num_rows, num_heads, k = x.shape
    n = w.shape[1]
    y = x.new_empty((num_rows, num_heads, n), dtype=out_dtype)
    if num_rows == 0:
        return y
    head_linear_kernel[(cdiv(num_rows, block_m), cdiv(n, block_n), num_heads)](
        x, w, y,
        num_rows, n,
        x.stride(0), x.stride(1), x.stride(2), w.stride(0), w.stride(1), w.stride(2), y.stride(0), y.stride(1), y.stride(2),
        K=k, NK=cdiv(k, block_k), DOT_IN_FP32=triton_support.interpreting(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=pipeline_stages(num_stages, block_m, block_n, block_k, x.element_size()),
    )
    return y


@jit
def _columns(o, WIDTH: tl.constexpr, PAD: tl.constexpr):
    """Which column offsets `o` (< PAD) lie inside WIDTH: a constant where nothing is padded, so that
    no mask tensor of a tile's width is kept live through the key loop."""
    if WIDTH == PAD:
        return tl.full(o.shape, 1, tl.int1)
    return o < WIDTH


@jit
def _gather_rows(store, slots, keep, i_v, stride_s, R: tl.constexpr, R_PAD: tl.constexpr, DR: tl.constexpr, DR_PAD: tl.constexpr,
                 V_SPLIT: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """One key block's latents C [BLOCK_N, R_PAD] and rope keys [BLOCK_N, DR_PAD] (its keys) and its
    values (C itself; with V_SPLIT > 1 the columns of chunk i_v, [BLOCK_N, R_PAD / V_SPLIT]), gathered
    through the block's slots. Keys not in `keep` (slots -1, or holding NaN/inf) and padding columns
    read +0.0."""
    o_r, o_d = tl.arange(0, R_PAD), tl.arange(0, DR_PAD)
    p_row = store + slots[:, None] * stride_s
    b_c = tl.load(p_row + o_r[None, :], mask=keep[:, None] & _columns(o_r, R, R_PAD)[None, :], other=0.0)
    b_kr = tl.load(p_row + R + o_d[None, :], mask=keep[:, None] & _columns(o_d, DR, DR_PAD)[None, :], other=0.0)
    if DOT_IN_FP32:  # the interpreter has no bfloat16 arithmetic
        b_c, b_kr = b_c.to(tl.float32), b_kr.to(tl.float32)
    if V_SPLIT == 1:
        return b_c, b_kr, b_c
    o_v = i_v * (R_PAD // V_SPLIT) + tl.arange(0, R_PAD // V_SPLIT)
    b_v = tl.load(p_row + o_v[None, :], mask=keep[:, None] & _columns(o_v, R, R_PAD)[None, :], other=0.0)
    if DOT_IN_FP32:
        b_v = b_v.to(tl.float32)
    return b_c, b_kr, b_v


@jit
def _update(m, l, acc, b_ql, b_qr, b_c, b_kr, b_v, vis, scale, SUM_BY_DOT: tl.constexpr):
    """The online-softmax step over one key block for every row; `vis` (broadcast to [ROWS, BLOCK_N])
    marks the keys each row sees. The one copy of this arithmetic: both walks call it.

    The score is (q_lat · c + q_rope · k_rope) * scale, two dots into one fp32 accumulator in that
    order; p · v is accumulated by the dot into the rescaled state. Keys a neighbour sees and this row
    does not add 0 · c products, and a row that sees no key of the block goes through the step with
    m' = m, alpha = exp(+0) = 1 (0 on its +0.0 start), p = 0: either can change the row's state only in
    the sign of a zero, and the tile's output makes every zero +0.0 (README.md). So no select, and one
    [ROWS, R] accumulator live."""
    s = tl.dot(b_ql, tl.trans(b_c), input_precision="ieee")  # [ROWS, BLOCK_N] fp32; ieee: fp32 is never tf32
    s = tl.dot(b_qr, tl.trans(b_kr), s, input_precision="ieee") * scale
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    alpha = tl.exp(m - m_safe)
    p = tl.where(vis, tl.exp(s - m_safe[:, None]), 0.0)
    l_new = l * alpha + _row_sum(p, SUM_BY_DOT)
    return m_new, l_new, tl.dot(p.to(b_v.dtype), b_v, acc * alpha[:, None], input_precision="ieee")  # [ROWS, R_PAD / V_SPLIT]


@jit
def _block(
    m, l, acc, b_ql, b_qr, pos, row_ok, i_blk, i_v, seq_row, store, L, S, scale, stride_s,
    R: tl.constexpr, R_PAD: tl.constexpr, DR: tl.constexpr, DR_PAD: tl.constexpr, V_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr,
):
    """One online-softmax step of every row over key block i_blk, masked per row and key."""
    keys = i_blk * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] absolute key positions
    vis = (keys[None, :] <= pos[:, None]) & (keys[None, :] < L) & row_ok[:, None]  # [ROWS, BLOCK_N]
    slots = tl.load(seq_row + keys, mask=keys < L, other=-1).to(tl.int64)  # [BLOCK_N]
    vis = vis & _in_range(slots, S)[None, :]
    key_ok = tl.max(vis.to(tl.int32), 0) > 0  # [BLOCK_N] seen by some row: written, finite
    b_c, b_kr, b_v = _gather_rows(store, slots, key_ok, i_v, stride_s, R, R_PAD, DR, DR_PAD, V_SPLIT, DOT_IN_FP32)
    return _update(m, l, acc, b_ql, b_qr, b_c, b_kr, b_v, vis, scale, SUM_BY_DOT)


@jit
def _full_block(
    m, l, acc, b_ql, b_qr, i_blk, i_v, seq_row, store, S, scale, stride_s,
    R: tl.constexpr, R_PAD: tl.constexpr, DR: tl.constexpr, DR_PAD: tl.constexpr, V_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr,
):
    """`_block` over a key block wholly below every row's position and inside the table: a key is
    visible to a row iff its slot is in the store, the same for every row, so the per-row masks drop
    out and `_update` gets the same values."""
    keys = i_blk * BLOCK_N + tl.arange(0, BLOCK_N)
    slots = tl.load(seq_row + keys).to(tl.int64)
    ok = _in_range(slots, S)  # [BLOCK_N]
    b_c, b_kr, b_v = _gather_rows(store, slots, ok, i_v, stride_s, R, R_PAD, DR, DR_PAD, V_SPLIT, DOT_IN_FP32)
    return _update(m, l, acc, b_ql, b_qr, b_c, b_kr, b_v, ok[None, :], scale, SUM_BY_DOT)


@jit
def _tile(
    i, q_lat, q_rope, store, o, slot_table, seq_ids, positions, i_hg, i_v,
    T, L, S, scale,
    stride_qt, stride_qh, stride_rt, stride_rh, stride_s, stride_ot, stride_oh, stride_sb,
    H: tl.constexpr, H_TILE: tl.constexpr, R: tl.constexpr, R_PAD: tl.constexpr, DR: tl.constexpr, DR_PAD: tl.constexpr,
    V_SPLIT: tl.constexpr, DOT_IN_FP32: tl.constexpr, SUM_BY_DOT: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
    """The tile that starts at query i, for heads [i_hg * H_TILE, (i_hg + 1) * H_TILE) and value chunk
    i_v: its rows (row r: the tile's query r // H_TILE, head r % H_TILE of the group), every key block
    they see, their latent outputs."""
    seq = tl.load(seq_ids + i)
    rows = tl.arange(0, ROWS)
    t = rows // H_TILE
    tok = i + t  # [ROWS]
    in_range = tok < T
    s_tok = tl.load(seq_ids + tok, mask=in_range, other=-1)
    p_tok = tl.load(positions + tok, mask=in_range, other=-1)
    p_prev = tl.load(positions + tok - 1, mask=in_range & (t > 0), other=-1)
    cut = (t > 0) & (~in_range | (s_tok != seq) | (p_prev + 1 != p_tok) | (p_tok % BLOCK_Q == 0))
    length = tl.min(tl.where(cut, t, BLOCK_Q), 0)
    head = i_hg * H_TILE + rows % H_TILE
    row_ok = (t < length) & (rows < BLOCK_Q * H_TILE) & (head < H)
    # Rows outside the tile read query i's head 0 (in bounds, no mask) and are never stored.
    tok = tl.where(row_ok, tok, i).to(tl.int64)
    head = tl.where(row_ok, head, 0)
    pos = tl.where(row_ok, p_tok, -1).to(tl.int32)
    o_r, o_d = tl.arange(0, R_PAD), tl.arange(0, DR_PAD)
    p_ql = q_lat + tok[:, None] * stride_qt + head[:, None] * stride_qh + o_r[None, :]
    b_ql = tl.load(p_ql, mask=_columns(o_r, R, R_PAD)[None, :], other=0.0)  # [ROWS, R_PAD]
    p_qr = q_rope + tok[:, None] * stride_rt + head[:, None] * stride_rh + o_d[None, :]
    b_qr = tl.load(p_qr, mask=_columns(o_d, DR, DR_PAD)[None, :], other=0.0)  # [ROWS, DR_PAD]
    if DOT_IN_FP32:
        b_ql, b_qr = b_ql.to(tl.float32), b_qr.to(tl.float32)

    # The blocks holding any row's visible keys: [0, hi_blk); those below the tile's first position and
    # inside the table, [0, full_blk), are whole and take `_full_block`, the rest `_block`, in ascending order.
    hi = tl.max(tl.where(row_ok, tl.minimum(pos, L - 1), -1), 0)
    hi_blk = tl.where(hi >= 0, hi // BLOCK_N + 1, 0)
    full_blk = (tl.minimum(tl.load(positions + i), L - 1).to(tl.int32) + 1) // BLOCK_N

    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, R_PAD // V_SPLIT], dtype=tl.float32)
    seq_row = slot_table + seq.to(tl.int64) * stride_sb
    if DOT_IN_FP32:  # the interpreter cannot take a loaded scalar as a `range` bound
        i_blk = 0
        while i_blk < full_blk:
            m, l, acc = _full_block(m, l, acc, b_ql, b_qr, i_blk, i_v, seq_row, store, S, scale, stride_s,
                                    R, R_PAD, DR, DR_PAD, V_SPLIT, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT)
            i_blk += 1
        while i_blk < hi_blk:
            m, l, acc = _block(m, l, acc, b_ql, b_qr, pos, row_ok, i_blk, i_v, seq_row, store, L, S, scale, stride_s,
                               R, R_PAD, DR, DR_PAD, V_SPLIT, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT)
            i_blk += 1
    else:
        for i_blk in range(0, full_blk):
            m, l, acc = _full_block(m, l, acc, b_ql, b_qr, i_blk, i_v, seq_row, store, S, scale, stride_s,
                                    R, R_PAD, DR, DR_PAD, V_SPLIT, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT)
        for i_blk in range(full_blk, hi_blk):
            m, l, acc = _block(m, l, acc, b_ql, b_qr, pos, row_ok, i_blk, i_v, seq_row, store, L, S, scale, stride_s,
                               R, R_PAD, DR, DR_PAD, V_SPLIT, BLOCK_N, DOT_IN_FP32, SUM_BY_DOT)

    has_keys = l > 0.0
    out = tl.where(has_keys[:, None], acc / tl.where(has_keys, l, 1.0)[:, None], 0.0)
    out = tl.where(out == 0.0, 0.0, out)  # every zero +0.0: the sign of a zero may come from the neighbours' keys
    o_v = i_v * (R_PAD // V_SPLIT) + tl.arange(0, R_PAD // V_SPLIT)
    p_o = o + tok[:, None] * stride_ot + head[:, None] * stride_oh + o_v[None, :]
    tl.store(p_o, out.to(o.dtype.element_ty), mask=row_ok[:, None] & _columns(o_v, R, R_PAD)[None, :])


@jit(do_not_specialize=["T", "L", "S"])
def mla_attn_fwd_kernel(
    q_lat, q_rope, store, o, slot_table, seq_ids, positions,
    T, L, S, scale,
    stride_qt, stride_qh, stride_rt, stride_rh, stride_s, stride_ot, stride_oh, stride_sb,
    H: tl.constexpr,
    H_TILE: tl.constexpr,
    R: tl.constexpr,
    R_PAD: tl.constexpr,
    DR: tl.constexpr,
    DR_PAD: tl.constexpr,
    V_SPLIT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    SUM_BY_DOT: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
):
    # Program (r, j) looks at query i = T - 1 - r (the last queries first: in a causal batch they see
    # the most keys) and runs the tile that starts there, if one does, for head group j // V_SPLIT and
    # value chunk j % V_SPLIT. A tile starts at a query whose sequence differs from the previous
    # query's, whose position does not follow it, or that opens an absolute block of BLOCK_Q positions.
    # One tile a program: a loop over tiles around the key walk keeps the tile's index tensors live
    # through it, which spilled at r = 512 on sm_90.
    i = T - 1 - tl.program_id(0)
    i_hg, i_v = tl.program_id(1) // V_SPLIT, tl.program_id(1) % V_SPLIT
    seq, pos = tl.load(seq_ids + i), tl.load(positions + i)
    seq_p = tl.load(seq_ids + i - 1, mask=i > 0, other=-1)
    pos_p = tl.load(positions + i - 1, mask=i > 0, other=-1)
    if (i == 0) | (seq_p != seq) | (pos_p + 1 != pos) | (pos % BLOCK_Q == 0):
        _tile(i, q_lat, q_rope, store, o, slot_table, seq_ids, positions, i_hg, i_v, T, L, S, scale,
              stride_qt, stride_qh, stride_rt, stride_rh, stride_s, stride_ot, stride_oh, stride_sb,
              H, H_TILE, R, R_PAD, DR, DR_PAD, V_SPLIT, DOT_IN_FP32, SUM_BY_DOT, BLOCK_Q, BLOCK_N, ROWS)


def dot_width(width: int) -> int:
    """The tile width for `width` columns that tl.dot takes: a power of two, at least 16."""
    return max(16, next_power_of_2(width))


def tile_shape(num_heads: int, block_m: int) -> tuple[int, int, int, int]:
    """(H_TILE, NUM_GROUPS, BLOCK_Q, ROWS) of tiles of `block_m` rows: BLOCK_Q queries times H_TILE
    heads, unpadded (20 heads in 64 rows: 3 queries, 60 rows); more heads than block_m split into
    NUM_GROUPS even groups. ROWS, the MMA tile's rows, is block_m (at least tl.dot's 16) in every case."""
    num_groups = -(-num_heads // block_m)
    h_tile = -(-num_heads // num_groups)
    return h_tile, num_groups, max(1, block_m // h_tile), max(16, block_m)


def attention_stages(num_stages: int, rows: int, block_n: int, r_pad: int, dr_pad: int, value_split: int, itemsize: int) -> int:
    """As many of the pinned stages as fit in SHARED_MEMORY_BYTES next to the query tiles: fp32 rows at
    r = 512, the battery's float32 pass, get one. Stages decide when key blocks are loaded, never the
    arithmetic; the count depends on the constants, the widths and the dtype alone."""
    per_stage = block_n * (r_pad + dr_pad + (r_pad // value_split if value_split > 1 else 0)) * itemsize
    return max(1, min(num_stages, (SHARED_MEMORY_BYTES - rows * (r_pad + dr_pad) * itemsize) // per_stage))


def mla_attn_latent(q_lat: Tensor, q_rope: Tensor, latent_store: Tensor, slot_table: Tensor, seq_ids: Tensor, positions: Tensor,
                    scale: float, *, block_m: int, block_n: int, value_split: int, num_warps: int, num_stages: int) -> Tensor:
    """q_lat [T, H, r], q_rope [T, H, dr], latent_store [S, r + dr] -> o_lat [T, H, r] in q_lat's dtype."""
    num_tokens, num_heads, rank = q_lat.shape
    rope = q_rope.shape[2]
    o = q_lat.new_empty(q_lat.shape)
    if num_tokens == 0:
        return o
    h_tile, num_groups, block_q, rows = tile_shape(num_heads, block_m)
    r_pad, dr_pad = dot_width(rank), dot_width(rope)
    q_rope, latent_store = (t if t.stride(-1) == 1 else t.contiguous() for t in (q_rope, latent_store))
    slot_table = slot_table.contiguous()
    mla_attn_fwd_kernel[(num_tokens, num_groups * value_split)](
        q_lat, q_rope, latent_store, o, slot_table, seq_ids.contiguous(), positions.contiguous(),
        num_tokens, slot_table.shape[1], latent_store.shape[0], float(scale),
        q_lat.stride(0), q_lat.stride(1), q_rope.stride(0), q_rope.stride(1), latent_store.stride(0), o.stride(0), o.stride(1),
        slot_table.stride(0),
        H=num_heads, H_TILE=h_tile, R=rank, R_PAD=r_pad, DR=rope, DR_PAD=dr_pad, V_SPLIT=value_split,
        DOT_IN_FP32=triton_support.interpreting(), SUM_BY_DOT=q_lat.dtype == torch.float32 and not triton_support.interpreting(),
        BLOCK_Q=block_q, BLOCK_N=block_n, ROWS=rows,
        num_warps=num_warps, num_stages=attention_stages(num_stages, rows, block_n, r_pad, dr_pad, value_split, q_lat.element_size()),
    )
    return o


def mla_fwd(q_nope: Tensor, q_rope: Tensor, latent_store: Tensor, kv_b_weight: Tensor, slot_table: Tensor, seq_ids: Tensor,
            positions: Tensor, scale: float, out_dtype: torch.dtype, *, block_m: int, block_n: int, block_k: int, gemm_block_m: int,
            gemm_block_n: int, gemm_num_warps: int, value_split: int, num_warps: int, num_stages: int) -> Tensor:
    """The three launches: absorb, attend, bring out -> [T, H, dv] in `out_dtype`."""
    num_heads, nope = q_nope.shape[1], q_nope.shape[2]
    weight = kv_b_weight.unflatten(0, (num_heads, -1))  # [H, dn + dv, r]
    w_uk_t, w_uv = weight[:, :nope].transpose(1, 2), weight[:, nope:]  # [H, r, dn], [H, dv, r]: views, no copies
    gemm = dict(block_m=gemm_block_m, block_n=gemm_block_n, block_k=block_k, num_warps=gemm_num_warps, num_stages=num_stages)
    q_lat = head_linear(q_nope, w_uk_t, q_nope.dtype, **gemm)  # [T, H, r]
    o_lat = mla_attn_latent(q_lat, q_rope, latent_store, slot_table, seq_ids, positions, scale, block_m=block_m, block_n=block_n,
                            value_split=value_split, num_warps=num_warps, num_stages=num_stages)  # [T, H, r]
    return head_linear(o_lat, w_uv, out_dtype, **gemm)  # [T, H, dv]


class _TritonMLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions, scale, packed_len, dtypes, config):
        ctx.save_for_backward(q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions)
        ctx.scale, ctx.packed_len, ctx.dtypes = scale, packed_len, dtypes
        return mla_fwd(q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions, scale,
                       torch_dtype(dtypes["output_dtype"]), **config)

    @staticmethod
    def backward(ctx, grad):
        q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(need) for t, need in zip((q_nope, q_rope, latent_store, kv_b_weight), ctx.needs_input_grad[:4])]
        with torch.enable_grad():
            out = native.mla_attn(*inputs, slot_table, seq_ids, positions, ctx.scale, ctx.packed_len, **ctx.dtypes)
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad.to(out.dtype), allow_unused=True))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None, None, None, None, None, None)


def mla_attn(q_nope: Tensor, q_rope: Tensor, latent_store: Tensor, kv_b_weight: Tensor, slot_table: Tensor, seq_ids: Tensor,
             positions: Tensor, scale: float, packed_len: int | None = None, *, input_dtype: str, output_dtype: str, kv_cache_dtype: str,
             weight_dtype: str, accum_dtype: str, block_m: int, block_n: int, block_k: int, gemm_block_m: int, gemm_block_n: int,
             gemm_num_warps: int, value_split: int, num_warps: int, num_stages: int, split_kv_size: int) -> Tensor:
    """Same arguments and result as `reference.mla_attn` (its docstring has the layout)."""
    config = dict(block_m=block_m, block_n=block_n, block_k=block_k, gemm_block_m=gemm_block_m, gemm_block_n=gemm_block_n,
                  gemm_num_warps=gemm_num_warps, value_split=value_split, num_warps=num_warps, num_stages=num_stages)
    check_constants(dict(config, input_dtype=input_dtype, output_dtype=output_dtype, kv_cache_dtype=kv_cache_dtype,
                         weight_dtype=weight_dtype, accum_dtype=accum_dtype, split_kv_size=split_kv_size))
    _, _, _, rank, _ = check_inputs(q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions, input_dtype,
                                    kv_cache_dtype, weight_dtype)
    if dot_width(rank) // value_split < 16:
        raise ValueError(f"{ID}: value_split {value_split} leaves chunks of {dot_width(rank) // value_split} latent columns; tl.dot needs 16")
    require_device(ID, q_nope, q_rope, latent_store, kv_b_weight, slot_table)
    if needs_grad(q_nope, q_rope, latent_store, kv_b_weight):
        dtypes = dict(input_dtype=input_dtype, output_dtype=output_dtype)
        return _TritonMLA.apply(q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions, scale, packed_len, dtypes,
                                config)
    return mla_fwd(q_nope, q_rope, latent_store, kv_b_weight, slot_table, seq_ids, positions, scale, torch_dtype(output_dtype), **config)


def check_constants(constants: dict) -> None:
    """Refuse dtypes, tiles and split-KV the kernels do not implement (one-line ValueErrors)."""
    if constants["accum_dtype"] != "float32":
        raise ValueError(f'{ID} accumulates in float32 only, got accum_dtype = "{constants["accum_dtype"]}"')
    if constants["split_kv_size"] != 0:
        raise ValueError(f"{ID} walks every key block of a row in one program: split_kv_size must be 0, got {constants['split_kv_size']}")
    for name in ("input_dtype", "output_dtype", "kv_cache_dtype", "weight_dtype"):
        if constants[name] not in DTYPES:
            raise ValueError(f"{ID}: {name} must be one of {', '.join(DTYPES)}, got {constants[name]!r}")
    if not constants["input_dtype"] == constants["kv_cache_dtype"] == constants["weight_dtype"]:
        raise ValueError(f"{ID}: input_dtype, kv_cache_dtype and weight_dtype must match (the tl.dot operands)")
    for name in ("block_m", "block_n", "block_k", "gemm_block_m", "gemm_block_n", "value_split"):
        value = constants[name]
        if not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{ID}: {name} must be a power of two, got {value!r}")
    for name in ("block_n", "block_k", "gemm_block_m", "gemm_block_n"):
        if constants[name] < 16:
            raise ValueError(f"{ID}: {name} must be >= 16 (tl.dot's smallest tile), got {constants[name]}")
    for name in ("num_warps", "gemm_num_warps"):
        if constants[name] not in (1, 2, 4, 8, 16):
            raise ValueError(f"{ID}: {name} must be a power of two <= 16, got {constants[name]!r}")
    if not isinstance(constants["num_stages"], int) or constants["num_stages"] < 1:
        raise ValueError(f"{ID}: num_stages must be >= 1, got {constants['num_stages']!r}")


def check_geometry(constants: dict, geometry: dict) -> None:
    """A model whose latent width the value chunks cannot tile is refused when the contract is fitted to it."""
    mla = geometry.get("mla")
    if mla and dot_width(mla["kv_lora_rank"]) // constants.get("value_split", 1) < 16:
        raise ValueError(f"kv_lora_rank {mla['kv_lora_rank']}: {ID} with value_split {constants['value_split']} needs chunks of >= 16 columns")


SOURCES = (head_linear_kernel, mla_attn_fwd_kernel, _tile, _full_block, _block, _update, _gather_rows, _columns, _row_sum, _in_range,
           tile_triton, triton_support)


def register(registry) -> None:
    """Register mla.triton@1; without Triton installed, nothing is registered."""
    if triton_available():
        registry.register(Impl(gpu_kernels=True, id=ID, version=1, region="mla", cases=ALL_CASES, fn=mla_attn,
                               check_constants=check_constants, check_geometry=check_geometry, tune=tuning.fit, sources=SOURCES))
