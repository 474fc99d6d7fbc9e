"""A probe for issue 22's prefill gap, not a contract impl: can a hand-scheduled kernel give attention.triton's bits
and overlap the softmax with the tensor cores?

attention.triton's prefill tile, compiled by Triton for Hopper, issues each 32-key block's QK wgmma and waits for it,
runs the softmax, issues the PV wgmma and waits for it, then folds: nothing of the softmax runs under an MMA
(RESULTS.md, "What bounds prefill"), and Triton 3.6 offers no way to say otherwise for this loop. Gluon (Triton's
lower-level language, `triton.experimental.gluon`, same compiler back end) takes the layouts, the shared-memory ring
and the wgmma waits from the kernel's author. This file writes the contract's per-block arithmetic there in two
schedules over attention.triton's 64-row tile (16 positions x the 4 query heads of a KV head; 4 warps, one warpgroup), K and V gathered through the slot table
with cp.async into a ring of shared-memory buffers:

- `sync`: attention.triton's order (QK, wait, softmax, PV, wait, fold);
- `overlap`: block j's QK and block j - 1's PV issued together, block j's softmax run while that PV is in flight,
  block j - 1's fold after it (the accumulator's fold stays in block order; only when each wgmma is waited moves).

Per block and row the operations are attention.triton's (`ops/attention/triton_steps.py`), in the layouts Triton
chose for them (the scores in a wgmma accumulator of instruction [16, 32, 16] over [4, 1] warps, p · V in [16, 128,
16], p converted to that product's A operand with k_width 2, the row reductions on the scores' layout; read off the
TTGIR of `attention_fwd_kernel` compiled for sm_90a), so the rows should carry the contract's bits: the script counts
the elements whose int16 views differ from attention.triton's (must be 0) and times the three kernels and flash SDPA as
graph replays, at Qwen3-8B's heads on one sequence (bench.py attention's prefill rows). attention.triton runs such a call
in two of these tiles stacked in one program of 8 warps, which halves the K and V loads a row.

    cd benchmarks && PYTHONPATH=../src python3 attention_gluon.py [--lengths 512,2048,8192] [--out FILE]
    python3 benchmarks/attention_gluon.py --compile-only     # no GPU: compile both schedules for sm_90a, print their resources

Only bf16, head_dim 128, causal, no window, query heads a power of two per KV head. A row's key blocks are walked as
attention.triton's tile walks them (whole blocks below the tile's first position unmasked, the rest masked per row),
which decides nothing of the bits either way (the masked step gives the unmasked one's values). Unlike attention.triton
it gathers the keys no row of the tile sees (past its last position) as they are, not as +0.0: their p is 0, so with
finite keys nothing changes, but a NaN there would reach the rows (attention.triton's module doc, the one limit).
"""
import argparse
import sys

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
except ImportError as error:  # the probe needs Triton's Gluon (3.5 and later)
    raise SystemExit(f"attention_gluon: no Gluon in this Triton ({error})")

HEADS = (32, 8, 128)
BLOCK_M, BLOCK_N, HEAD_DIM, STAGES = 64, 32, 128, 3
SCHEDULES = (("sync", False, 64), ("overlap", True, 64), ("sync-8w", False, 128), ("overlap-8w", True, 128))  # name, overlap, rows


@gluon.jit
def _settled(x):
    """x unchanged as an opaque register copy: nothing may fold a later add into the wgmma that made it (triton_support.settled)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


@gluon.constexpr_function
def _load_layout(num_warps):
    """Rows of 128 bf16 as 16-byte pieces over the warps: how the kernel reads q and gathers K and V rows."""
    return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[num_warps, 1], order=[1, 0])


@gluon.jit
def _issue(j, k_bufs, v_bufs, k, v, slot_table, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh):
    """cp.async of key block j's K and V rows, gathered through the slot table, into ring buffer j % BUFFERS (+0.0 for
    keys past the table or outside the store, as `_gather_kv` masks them); one commit group per block, empty or not."""
    BUFFERS: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    D: gl.constexpr = k_bufs.shape[2]
    LOAD: gl.constexpr = _load_layout(gl.num_warps())
    keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LOAD))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
    slots = gl.load(slot_table + keys, mask=keys < L, other=-1).to(gl.int64)
    ok = (slots >= 0) & (slots < S)
    stage = j % BUFFERS
    async_copy.async_copy_global_to_shared(k_bufs.index(stage), k + slots[:, None] * stride_ks + kv_head * stride_kh + o_d[None, :],
                                           mask=ok[:, None])
    async_copy.async_copy_global_to_shared(v_bufs.index(stage), v + slots[:, None] * stride_vs + kv_head * stride_vh + o_d[None, :],
                                           mask=ok[:, None])
    async_copy.commit_group()


@gluon.jit
def _landed(OUTSTANDING: gl.constexpr):
    """Wait until at most OUTSTANDING blocks' copies are in flight, then make every thread's copies visible to the
    wgmma (async proxy) and to the other warps."""
    async_copy.wait_group(OUTSTANDING)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _softmax(s, m, l, j, pos, row_ok, slot_table, L, S, scale, MASKED: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
    """Block j's online-softmax step up to p · V, as `_update` (and `_block`'s selects where MASKED): the new m and l,
    alpha, p in bf16 and which rows see a key of the block."""
    keys = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
    slots = gl.load(slot_table + keys, mask=keys < L, other=-1)
    ok = (slots >= 0) & (slots < S)
    s = s * scale
    if MASKED:
        vis = (keys[None, :] <= pos[:, None]) & (keys[None, :] < L) & row_ok[:, None] & ok[None, :]
        s = gl.where(vis, s, float("-inf"))
        active = gl.max(vis.to(gl.int32), 1) > 0
    else:
        s = gl.where(ok[None, :], s, float("-inf"))
        active = pos >= -1  # every row
    m_new = gl.maximum(m, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp(m - m_safe)
    p = gl.exp(s - m_safe[:, None])
    l_new = l * alpha + gl.sum(p, 1)
    if MASKED:
        m_new = gl.where(active, m_new, m)
        l_new = gl.where(active, l_new, l)
    return m_new, l_new, alpha, p.to(gl.bfloat16), active


@gluon.jit
def _fold(acc, alpha, pv, active, MASKED: gl.constexpr, O_LAYOUT: gl.constexpr):
    """acc · alpha + p · V (`_fold_sums`), where MASKED for the rows that saw a key of the block (`_block`'s select)."""
    acc_new = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None] + _settled(pv)
    if MASKED:
        acc_new = gl.where(gl.convert_layout(active, gl.SliceLayout(1, O_LAYOUT))[:, None], acc_new, acc)
    return acc_new


@gluon.jit
def _fold_block(acc, alpha, pv, active, j, full_blk, O_LAYOUT: gl.constexpr):
    """`_fold` of block j, masked where the walk masks it (j at or past full_blk)."""
    if j < full_blk:
        acc = _fold(acc, alpha, pv, active, False, O_LAYOUT)
    else:
        acc = _fold(acc, alpha, pv, active, True, O_LAYOUT)
    return acc


@gluon.jit
def prefill_kernel(q, k, v, o, slot_table, L, S, scale,
                   stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
                   G: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   OVERLAP: gl.constexpr):
    """Program (tile, KV head) of one sequence at positions 0 .. L - 1, its keys through `slot_table` [L]."""
    # 16 rows a warp: one warpgroup for 64 rows, two stacked for 128 (attention.triton's many-query tile on Hopper)
    WARPS: gl.constexpr = BLOCK_M // 16
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_N, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    LOAD: gl.constexpr = _load_layout(WARPS)
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # overlap: block j - 1's V is still read by its PV while block j's softmax runs, so one buffer more
    BUFFERS: gl.constexpr = STAGES + OVERLAP

    # attention.triton's tile: BLOCK_Q = BLOCK_M / G consecutive positions x the G query heads of one KV head, row r at
    # position m0 + r // G of head kv_head * G + r % G, so that every row shares the tile's K and V loads
    BLOCK_Q: gl.constexpr = BLOCK_M // G
    tile = gl.num_programs(0) - 1 - gl.program_id(0)  # last rows first: they see the most keys
    kv_head = gl.program_id(1)
    m0 = tile * BLOCK_Q
    r_ld = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LOAD))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
    q_rows = q + (m0 + r_ld // G).to(gl.int64) * stride_qt + (kv_head * G + r_ld % G) * stride_qh
    b_q = gl.load(q_rows[:, None] + o_d[None, :], mask=(m0 + r_ld // G < L)[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, D], SMEM, b_q)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [BUFFERS, BLOCK_N, D], SMEM)
    v_bufs = gl.allocate_shared_memory(gl.bfloat16, [BUFFERS, BLOCK_N, D], SMEM)

    pos = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT)) // G
    row_ok = pos < L
    hi_blk = gl.minimum(m0 + BLOCK_Q - 1, L - 1) // BLOCK_N + 1
    full_blk = gl.minimum((m0 + 1) // BLOCK_N, hi_blk)  # blocks every row sees whole
    m = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=O_LAYOUT)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_LAYOUT)
    zero_o = gl.zeros([BLOCK_M, D], gl.float32, layout=O_LAYOUT)
    for i in gl.static_range(STAGES - 1):
        _issue(i, k_bufs, v_bufs, k, v, slot_table, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)

    if not OVERLAP:
        for j in range(0, hi_blk):
            _landed(STAGES - 2)
            _issue(j + STAGES - 1, k_bufs, v_bufs, k, v, slot_table, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)  # into block j - 1's buffer: its wgmmas were waited before the barrier
            s = warpgroup_mma(q_smem, k_bufs.index(j % BUFFERS).permute((1, 0)), zero_s, use_acc=False)
            if j < full_blk:
                m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, slot_table, L, S, scale, False, BLOCK_N, S_LAYOUT)
            else:
                m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, slot_table, L, S, scale, True, BLOCK_N, S_LAYOUT)
            pv = warpgroup_mma(gl.convert_layout(p, P_LAYOUT), v_bufs.index(j % BUFFERS), zero_o, use_acc=False)
            acc = _fold_block(acc, alpha, pv, active, j, full_blk, O_LAYOUT)
    else:
        # block 0 by the masked step (the general one: for a whole block it gives the unmasked step's values)
        _landed(STAGES - 2)
        _issue(STAGES - 1, k_bufs, v_bufs, k, v, slot_table, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)
        s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False)
        m, l, alpha_prev, p, active_prev = _softmax(s, m, l, 0, pos, row_ok, slot_table, L, S, scale, True, BLOCK_N, S_LAYOUT)
        p_prev = gl.convert_layout(p, P_LAYOUT)
        for j in range(1, hi_blk):
            _landed(STAGES - 2)
            _issue(j + STAGES - 1, k_bufs, v_bufs, k, v, slot_table, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)  # into block j - 2's buffer, whose PV was waited in the last iteration
            s_mma = warpgroup_mma(q_smem, k_bufs.index(j % BUFFERS).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            pv_mma = warpgroup_mma(p_prev, v_bufs.index((j - 1) % BUFFERS), zero_o, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_mma, ))
            if j < full_blk:
                m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, slot_table, L, S, scale, False, BLOCK_N, S_LAYOUT)
            else:
                m, l, alpha, p, active = _softmax(s, m, l, j, pos, row_ok, slot_table, L, S, scale, True, BLOCK_N, S_LAYOUT)
            pv, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(pv_mma, p_prev))
            acc = _fold_block(acc, alpha_prev, pv, active_prev, j - 1, full_blk, O_LAYOUT)
            p_prev, alpha_prev, active_prev = gl.convert_layout(p, P_LAYOUT), alpha, active
        pv = warpgroup_mma(p_prev, v_bufs.index((hi_blk - 1) % BUFFERS), zero_o, use_acc=False)
        acc = _fold_block(acc, alpha_prev, pv, active_prev, hi_blk - 1, full_blk, O_LAYOUT)
    async_copy.wait_group(0)

    # `_finish`: a row that saw no key gives 0, a zero acc is +0.0
    l = gl.convert_layout(l, gl.SliceLayout(1, O_LAYOUT))
    has_keys = l > 0.0
    acc = gl.where(acc == 0.0, 0.0, acc)
    out = gl.where(has_keys[:, None], acc / gl.where(has_keys, l, 1.0)[:, None], 0.0)
    r_o = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_LAYOUT))
    d_o = gl.arange(0, D, layout=gl.SliceLayout(0, O_LAYOUT))
    o_rows = o + (m0 + r_o // G).to(gl.int64) * stride_ot + (kv_head * G + r_o % G) * stride_oh
    gl.store(o_rows[:, None] + d_o[None, :], out.to(gl.bfloat16), mask=(m0 + r_o // G < L)[:, None])


def gluon_prefill(q, k_store, v_store, slot_table, scale, overlap: bool, rows: int = BLOCK_M) -> torch.Tensor:
    """One sequence's causal attention, q [L, H, D], the store [S, Hkv, D], slot_table [L] (or [1, L]), in tiles of
    `rows` rows (64: one warpgroup, 128: two)."""
    length, num_heads, head_dim = q.shape
    o = torch.empty_like(q)
    group = num_heads // k_store.shape[1]
    prefill_kernel[(-(-length // (rows // group)), k_store.shape[1])](
        q, k_store, v_store, o, slot_table.reshape(-1), length, k_store.shape[0], float(scale),
        q.stride(0), q.stride(1), k_store.stride(0), k_store.stride(1), v_store.stride(0), v_store.stride(1), o.stride(0), o.stride(1),
        G=group, D=head_dim, BLOCK_M=rows, BLOCK_N=BLOCK_N, STAGES=STAGES, OVERLAP=overlap, num_warps=rows // 16)
    return o


def _compile(kernel, constants: dict, pointers: dict, num_warps: int):
    """kernel compiled for sm_90a on this machine: (PTX, shared bytes, registers, spill-store bytes)."""
    import inspect
    import pathlib
    import tempfile

    from gdn_registers import ptxas
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource

    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(inspect.signature(kernel.fn).parameters):
        if name in constants:
            signature[name], constexprs[(i,)] = "constexpr", constants[name]
        elif name in pointers:
            signature[name], attrs[(i,)] = pointers[name], [["tt.divisibility", 16]]
        elif name.startswith("stride"):  # a launch specializes them so: every stride here is a multiple of 16
            signature[name], attrs[(i,)] = "i32", [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    compiled = triton_compile(GluonASTSource(kernel, signature, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as folder:
        registers, spills = ptxas(ptx, pathlib.Path(folder), "kernel")
    return ptx, compiled.metadata.shared, registers, spills


def compile_only() -> None:
    """The probe's four schedules and attention.triton's Gluon tile (`ops/attention/gluon_tile.py`, with and without the
    log-sum-exp, the lone and stacked tiles) compiled for sm_90a on this machine (no GPU): registers, spills, shared
    memory and the wgmma waits (an overlapped loop waits with one group in flight)."""
    import re

    from isoexec.ops.attention import gluon_tile

    def report(label, ptx, shared, registers, spills):
        waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)
        print(f"{label:<16} registers {registers}  spill stores {spills} B  shared {shared} B  wgmma.mma_async {ptx.count('wgmma.mma_async')}  "
              f"waits {waits}  ex2 {ptx.count('ex2.approx')}", flush=True)

    pointers = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "slot_table": "*i64"}
    for label, overlap, rows in SCHEDULES:
        constants = {"G": 4, "D": HEAD_DIM, "BLOCK_M": rows, "BLOCK_N": BLOCK_N, "STAGES": STAGES, "OVERLAP": overlap}
        report(label, *_compile(prefill_kernel, constants, pointers, rows // 16))
    pointers |= {"lse": "*fp32", "seq_ids": "*i64", "positions": "*i64"}
    for warps, group, positions in ((4, 4, 16), (8, 4, 32), (4, 2, 32)):  # 8B's lone and stacked tiles, 0.6B's
        for lse in (False, True):
            constants = {"G": group, "G_PAD": group, "D": HEAD_DIM, "BLOCK_Q": positions, "BLOCK_N": BLOCK_N, "WITH_LSE": lse}
            report(f"tile-{warps}w-g{group}{'-lse' if lse else ''}", *_compile(gluon_tile.gluon_fwd_kernel, constants, pointers, warps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="2048,8192,512", help="sequence lengths, comma-separated")
    parser.add_argument("--out", help="append each row here too")
    parser.add_argument("--compile-only", action="store_true", help="compile for sm_90a without a GPU and print each schedule's resources")
    args = parser.parse_args()
    if args.compile_only:
        return compile_only()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attention import _randn
    from isoexec.ops.attention import gluon_tile
    from isoexec.ops.attention import triton as attention_triton
    from isoexec.ops.attention.metadata import packed_slot_table
    from timing import graphed_ms

    device, dtype = torch.device("cuda"), torch.bfloat16
    walk = attention_triton.bench_op()
    generator = torch.Generator(device=device).manual_seed(0)
    num_heads, num_kv_heads, head_dim = HEADS
    for length in map(int, args.lengths.split(",")):
        q = _randn(generator, length, num_heads, head_dim, dtype=dtype)
        k, v = (_randn(generator, length, num_kv_heads, head_dim, dtype=dtype) for _ in range(2))
        slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, length], device=device))
        scale = head_dim**-0.5
        call = (q, k, v, slot_table, seq_ids, positions, scale)
        expected = walk(*call).view(torch.int16)
        row = {"length": length}
        fns = {"triton": lambda: walk(*call)}

        def tile(call=call):
            saved, gluon_tile.ENABLED = gluon_tile.ENABLED, True
            try:
                return walk(*call)
            finally:
                gluon_tile.ENABLED = saved

        row["tile_differing"] = int((tile().view(torch.int16) != expected).sum())
        fns["tile"] = tile
        for name, overlap, rows in SCHEDULES:
            try:
                out = gluon_prefill(q, k, v, slot_table, scale, overlap, rows)
                row[f"{name}_differing"] = int((out.view(torch.int16) != expected).sum())
                fns[name] = lambda overlap=overlap, rows=rows: gluon_prefill(q, k, v, slot_table, scale, overlap, rows)
            except Exception as error:  # noqa: BLE001  (one schedule failing must not hide the other)
                row[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        dense = [t.transpose(0, 1)[None].contiguous() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fns["flash"] = lambda: F.scaled_dot_product_attention(*dense, is_causal=True, scale=scale, enable_gqa=True)
            for name, fn in fns.items():
                row[f"{name}_ms"] = graphed_ms(fn, device)
        line = (f"length {length}  " + "  ".join(f"{n} {row[f'{n}_ms'] * 1e3:.1f} us" for n in fns)
                + "".join(f"  {n}/flash {row['flash_ms'] / row[f'{n}_ms']:.2f}" for n in fns if n != "flash")
                + "".join(f"  {key} {value}" for key, value in row.items() if key.endswith(("_differing", "_error"))))
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
