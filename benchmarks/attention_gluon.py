"""attention.triton's prefill in Gluon (`ops/attention/gluon_tile.py`) against the Triton walk and flash SDPA: the bits
(elements whose int16 views differ from the walk's: must be 0) and graph-replay times at Qwen3-8B's heads (32 query
heads, 8 KV heads of 128, bf16) on one sequence, as bench.py attention's prefill rows. `tile`: the op's Gluon tile as
ISOEXEC_ATTENTION_GLUON=1 runs it (lone 64-row tiles, the walk's order); `overlap-8w` / `overlap-4w`: the tile's
overlapped loop (block j's softmax under block j - 1's PV wgmma), stacked and lone; `tile-168r`: the op's tile capped
at 168 registers a thread (three programs an SM); `sync-4w` / `sync-8w`: a probe kernel of the walk's order for one
sequence from position 0 (no metadata), lone and stacked.

    cd benchmarks && PYTHONPATH=../src python3 attention_gluon.py [--lengths 2048,8192,512] [--out FILE]
    PYTHONPATH=src python3 benchmarks/attention_gluon.py --compile-only   # no GPU: every kernel built for sm_90a, its resources

Why: compiled by Triton the walk issues each 32-key block's QK wgmma and waits, runs the softmax, issues the PV wgmma and
waits, then folds, so nothing of the softmax runs under an MMA (docs/experiments.md, "What bounds prefill"). The overlapped loop
was written to change that and was slower on an H100; the walk's order written in Gluon was faster than Triton's code
for it (docs/experiments.md, "The spread decode and the Gluon tile").

The `sync` kernel is one sequence from position 0, bf16, head_dim 128, query heads a power of two per KV head.
"""
import argparse
import sys

import torch

from isoexec.ops.attention import gluon_tile

if not gluon_tile.available():  # the probe needs Triton's Gluon (3.5 and later)
    raise SystemExit("attention_gluon: no Gluon in this Triton")
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: E402

HEADS = (32, 8, 128)
BLOCK_M, BLOCK_N, HEAD_DIM, STAGES = 64, 32, 128, 3
SYNC_ROWS = (64, 128)  # the Triton order in Gluon: one warpgroup, two stacked


@gluon.jit
def prefill_kernel(q, k, v, o, slot_table, L, S, scale,
                   stride_qt, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ot, stride_oh,
                   G: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Program (tile, KV head) of one sequence at positions 0 .. L - 1, its keys through `slot_table` [L], in the Triton
    walk's order: gluon_tile's block step (`_issue`, `_landed`, `_softmax`, `_fold_block`) with every wgmma waited at
    once."""
    # 16 rows a warp: one warpgroup for 64 rows, two stacked for 128 (attention.triton's many-query tile on Hopper)
    WARPS: gl.constexpr = BLOCK_M // 16
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_N, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    LOAD: gl.constexpr = gluon_tile._rows_layout(WARPS)
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

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
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D], SMEM)
    v_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D], SMEM)

    pos = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT)) // G
    row_ok = pos < L
    hi = gl.minimum(m0 + BLOCK_Q - 1, L - 1)  # the tile's last visible key
    hi_blk = hi // BLOCK_N + 1
    full_blk = gl.minimum((m0 + 1) // BLOCK_N, hi_blk)  # blocks every row sees whole
    m = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    l = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=O_LAYOUT)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_LAYOUT)
    zero_o = gl.zeros([BLOCK_M, D], gl.float32, layout=O_LAYOUT)
    for i in gl.static_range(STAGES - 1):
        gluon_tile._issue(i, hi, k_bufs, v_bufs, k, v, slot_table, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)

    for j in range(hi_blk):
        gluon_tile._landed(STAGES - 2)
        # into block j - 1's buffer: its wgmmas were waited before the barrier
        gluon_tile._issue(j + STAGES - 1, hi, k_bufs, v_bufs, k, v, slot_table, L, S, kv_head, stride_ks, stride_kh, stride_vs, stride_vh)
        s = warpgroup_mma(q_smem, k_bufs.index(j % STAGES).permute((1, 0)), zero_s, use_acc=False)
        if j < full_blk:
            m, l, alpha, p, active = gluon_tile._softmax(s, m, l, j, pos, row_ok, slot_table, L, S, scale, False, BLOCK_N)
        else:
            m, l, alpha, p, active = gluon_tile._softmax(s, m, l, j, pos, row_ok, slot_table, L, S, scale, True, BLOCK_N)
        pv = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), P_LAYOUT), v_bufs.index(j % STAGES), zero_o, use_acc=False)
        acc = gluon_tile._fold_block(acc, alpha, pv, active, j, full_blk)
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


def gluon_prefill(q, k_store, v_store, slot_table, scale, rows: int = BLOCK_M) -> torch.Tensor:
    """One sequence's causal attention in the Triton walk's order, q [L, H, D], the store [S, Hkv, D], slot_table [L] (or
    [1, L]), in tiles of `rows` rows (64: one warpgroup, 128: two)."""
    length, num_heads, head_dim = q.shape
    o = torch.empty_like(q)
    group = num_heads // k_store.shape[1]
    prefill_kernel[(-(-length // (rows // group)), k_store.shape[1])](
        q, k_store, v_store, o, slot_table.reshape(-1), length, k_store.shape[0], float(scale),
        q.stride(0), q.stride(1), k_store.stride(0), k_store.stride(1), v_store.stride(0), v_store.stride(1), o.stride(0), o.stride(1),
        G=group, D=head_dim, BLOCK_M=rows, BLOCK_N=BLOCK_N, STAGES=STAGES, num_warps=rows // 16)
    return o


def _compile(kernel, constants: dict, pointers: dict, num_warps: int):
    """kernel compiled for sm_90a on this machine: (PTX, shared bytes, registers, spill-store bytes). Pointers and
    strides are marked divisible by 16, as a launch specializes them here."""
    from sm90 import compile_kernel, ptxas

    compiled = compile_kernel(kernel, constants, lambda name: pointers.get(name, "fp32" if name == "scale" else "i32"), num_warps,
                              aligned=lambda name, type_: name in pointers or name.startswith("stride"), gluon=True)
    ptx = compiled.asm["ptx"]
    registers, spills = ptxas(ptx)
    return ptx, compiled.metadata.shared, registers, spills


def compile_only() -> None:
    """The walk-order kernel (`sync`) and attention.triton's Gluon tile (`ops/attention/gluon_tile.py`, with and without the
    log-sum-exp, the lone and stacked tiles) compiled for sm_90a on this machine (no GPU): registers, spills, shared
    memory and the wgmma waits (an overlapped loop waits with one group in flight)."""
    import re

    def report(label, ptx, shared, registers, spills):
        waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)
        print(f"{label:<24} registers {registers}  spill stores {spills} B  shared {shared} B  wgmma.mma_async {ptx.count('wgmma.mma_async')}  "
              f"waits {waits}  ex2 {ptx.count('ex2.approx')}", flush=True)

    pointers = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "slot_table": "*i64"}
    for rows in SYNC_ROWS:
        constants = {"G": 4, "D": HEAD_DIM, "BLOCK_M": rows, "BLOCK_N": BLOCK_N, "STAGES": STAGES}
        report(f"sync-{rows // 16}w", *_compile(prefill_kernel, constants, pointers, rows // 16))
    pointers |= {"lse": "*fp32", "seq_ids": "*i64", "positions": "*i64"}
    for overlap in (False, True):
        for warps, group, positions, queries in ((4, 4, 16, 16), (8, 4, 32, 32), (4, 2, 32, 32), (4, 4, 16, 1)):  # 8B's lone, stacked, 0.6B's, decode
            for lse in (False, True) if queries > 1 else (False,):
                constants = {"G": group, "G_PAD": group, "D": HEAD_DIM, "BLOCK_Q": positions, "BLOCK_N": BLOCK_N, "QUERIES": queries,
                             "WITH_LSE": lse, "OVERLAP": overlap}
                label = f"tile{'-overlap' if overlap else ''}-{warps}w-g{group}{'-decode' if queries == 1 else ''}{'-lse' if lse else ''}"
                report(label, *_compile(gluon_tile.gluon_fwd_kernel, constants, pointers, warps))


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

        # the op's tile (lone 64-row tiles in the walk's order: what ISOEXEC_ATTENTION_GLUON=1 runs), and the overlapped
        # loop stacked as attention_fwd stacked the walk's tiles before the tile stopped stacking
        launches = []
        launch = gluon_tile.attention_fwd
        gluon_tile.attention_fwd = lambda *a, **kw: launches.append(1) or launch(*a, **kw)
        try:
            row["tile_differing"] = int((tile().view(torch.int16) != expected).sum())
            fns["tile"] = tile
        except Exception as error:  # noqa: BLE001  (the tile failing must not hide the other rows)
            row["tile_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        finally:
            gluon_tile.attention_fwd = launch
        if not launches:  # attention_fwd did not hand the call to the tile: its row would be the walk's
            row["tile_error"] = "not taken (gluon_tile.applies refused the call)"
            fns.pop("tile", None)

        def shaped(warps, overlap, maxnreg=None, call=call):
            positions = 16 * warps // 4
            return gluon_tile.attention_fwd(*call, torch.empty_like(q), None, group=4, g_pad=4, tile_positions=positions, queries=positions,
                                            block_n=BLOCK_N, num_warps=warps, overlap=overlap, maxnreg=maxnreg)

        # `tile-168r`: the op's tile capped at 168 registers a thread (211 uncapped; 32 bytes spilled), so that three
        # programs fit an SM as the probe's do
        for name, warps, overlap, maxnreg in (("overlap-8w", 8, True, None), ("overlap-4w", 4, True, None), ("tile-168r", 4, False, 168)):
            try:
                row[f"{name}_differing"] = int((shaped(warps, overlap, maxnreg).view(torch.int16) != expected).sum())
                fns[name] = lambda warps=warps, overlap=overlap, maxnreg=maxnreg: shaped(warps, overlap, maxnreg)
            except Exception as error:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        for rows in SYNC_ROWS:
            name = f"sync-{rows // 16}w"
            try:
                out = gluon_prefill(q, k, v, slot_table, scale, rows)
                row[f"{name}_differing"] = int((out.view(torch.int16) != expected).sum())
                fns[name] = lambda rows=rows: gluon_prefill(q, k, v, slot_table, scale, rows)
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
