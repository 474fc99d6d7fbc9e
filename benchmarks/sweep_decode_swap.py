"""Decode GEMMs with the operands swapped: yᵀ = W xᵀ, the weight as the tensor core's wide side (an
experiment script, docs/experiments.md; not a benchmark of record).

    PYTHONPATH=src:benchmarks python3 benchmarks/sweep_decode_swap.py [--model qwen3-8b-random] [--quick]

At M = 1 linear.triton's decode tile (64x32x256) stages a 64-row x tile of which one row is real: two
thirds of its shared memory hold zeros, and one program fits an SM, so few weight bytes are in flight.
Swapped, a program owns BLOCK_N weight rows and BLOCK_M (>= 16, tl.dot's least) batch rows:
`tl.dot(W tile [BLOCK_N, BLOCK_K], xᵀ tile [BLOCK_K, BLOCK_M])`, the shape cuBLAS's decode kernels take.
Each output element is still the sum of the same bf16 products over K in ascending BLOCK_K blocks into
one fp32 accumulator; whether the tensor core adds a block's products in the same order with the operands
exchanged is what the `bits` column measures, against linear.triton's training tile (the bits every
case must give) at M = 1, 16 and 64. The sweep launches `ops/linear/swapped_triton.py`'s kernel with
every tile dimension given; that module's launch fixes them (64 x 16, 4 warps), as this sweep chose.
(The first run, `results/2026-12-04_2fdcdee_swapped/sweep_decode_swap.txt`, launched a copy of the
kernel written here before the module existed: the same loads, products and single rounding, no bias.) `--row-parallel`
times o_proj's and down_proj's fold before and with that launch.
"""

import argparse
import contextlib

import torch
import triton

from isoexec.model import PRESETS
from isoexec.ops.linear import row_parallel_triton, swapped_triton, triton as linear_triton, tuning
from timing import graphed_ms


def swapped(x, w, block_n, block_m, block_k, num_warps, num_stages):
    """x Wᵀ by `swapped_triton.linear_swapped_kernel` with every tile dimension given (its launch fixes them)."""
    m, k = x.shape
    n = w.shape[0]
    y = x.new_empty((m, n))
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    swapped_triton.linear_swapped_kernel[grid](
        x, w, x, y, m, n, x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
        K=k, G=1, NK=triton.cdiv(k, block_k), HAS_BIAS=False, DOT_IN_FP32=x.device.type == "cpu",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages)
    return y


@contextlib.contextmanager
def without_swap():
    """linear.triton's launches as they were before its swapped one (`swapped_triton.fits` never true):
    the reference bits and the listed tile's times."""
    saved = swapped_triton.SWAPPED_MAX_ROWS
    swapped_triton.SWAPPED_MAX_ROWS = 0
    try:
        yield
    finally:
        swapped_triton.SWAPPED_MAX_ROWS = saved


def row_parallel(model: str, ms, num_leaves: int = 8):
    """o_proj and down_proj as the engine's decode runs them (the sequential fold of 8 leaves, the decode
    tile): the launch before the swapped one beside the swapped fold, bits compared."""
    device = torch.device("cuda")
    print(f"== {model} row-parallel (8 leaves, sequential fold): ms of a CUDA-graph replay at M = {', '.join(map(str, ms))}", flush=True)
    for name in ("o_proj", "down_proj"):
        n, k = shapes(model)[name]
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for m in ms]
        fwd = lambda x: row_parallel_triton.fused_fwd(x, w, None, torch.bfloat16, num_leaves=num_leaves, **tuning.hopper_decode_tile(n, k))  # noqa: E731
        with without_swap():
            before = [graphed_ms(lambda x=x: fwd(x), device) for x in xs]
            wants = [fwd(x) for x in xs]
        after = [graphed_ms(lambda x=x: fwd(x), device) for x in xs]
        same = all(torch.equal(fwd(x).view(torch.int16), want.view(torch.int16)) for x, want in zip(xs, wants))
        cublas = [graphed_ms(lambda x=x: torch.nn.functional.linear(x, w), device) for x in xs]
        gbs = lambda t: n * k * 2 / t / 1e6  # noqa: E731
        print(f"{name:<10} N={n:<6} K={k:<5} " + "  ".join(f"{label} {' / '.join(f'{t:.4f}' for t in ts)} ({gbs(ts[0]):.0f} GB/s)"
              for label, ts in (("cublas", cublas), ("fused", before), ("swapped", after))) + f"  {'bits equal' if same else 'BITS DIFFER'}", flush=True)


def candidates(quick: bool, narrow: bool = False):
    """Tiles to sweep. `narrow`: 16 and 32 weight rows a program (below wgmma's 64: Triton takes mma.sync,
    whose bits are what the sweep checks), 1 or 2 warps, for shapes whose N / 64 programs leave SMs idle."""
    for block_n in ((16, 32) if narrow else (64, 128, 256)):
        for block_m in ((16,) if narrow else (16, 64)):
            for block_k in (128, 256):
                for num_stages in ((4,) if quick else (3, 4, 6)):
                    smem = num_stages * (block_n + block_m) * block_k * 2
                    if smem > 220 * 1024:
                        continue
                    for num_warps in ((1, 2) if narrow else (8 if block_n == 256 else 4,)):
                        yield dict(block_n=block_n, block_m=block_m, block_k=block_k, num_warps=num_warps, num_stages=num_stages)


def shapes(model: str):
    spec = PRESETS[model]
    p = spec.projections
    one = lambda op: next(iter(p[op]))  # noqa: E731
    (nq, k), (nk, _), (ng, _) = one("q_proj"), one("k_proj"), one("gate_proj")
    return {"qkv (joined)": (nq + 2 * nk, k), "o_proj": one("o_proj"), "gate_up (joined)": (2 * ng, k),
            "down_proj": one("down_proj"), "lm_head": one("lm_head")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--narrow", action="store_true", help="sweep 16 and 32 weight rows a program instead")
    parser.add_argument("--row-parallel", action="store_true", help="only o_proj and down_proj's fold: before and with the swapped launch")
    args = parser.parse_args()
    device = torch.device("cuda")
    ms = (1, 16, 64)
    for model in args.model or ["qwen3-8b-random", "qwen3-0.6b-random"]:
        row_parallel(model, ms)
        if args.row_parallel:
            continue
        print(f"== {model}: ms of a CUDA-graph replay at M = {', '.join(map(str, ms))}; GB/s = weight bytes / time at M = 1; "
              "bits: equal to linear.triton's training tile (grid or persistent launch) at every M", flush=True)
        for name, (n, k) in shapes(model).items():
            torch.manual_seed(0)
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
            xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for m in ms]
            train = linear_triton.hopper_constants(n, k)
            train_tile = {key: train[key] for key in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
            decode_tile = tuning.hopper_decode_tile(n, k)
            with without_swap():
                wants = [linear_triton.linear_fwd(x, w, None, torch.bfloat16, **train_tile) for x in xs]
            gbs = lambda t: n * k * 2 / t / 1e6  # noqa: E731
            rows = [("cublas", [graphed_ms(lambda x=x: torch.nn.functional.linear(x, w), device) for x in xs], None)]
            with without_swap():
                listed = [graphed_ms(lambda x=x: linear_triton.linear_fwd(x, w, None, torch.bfloat16, **decode_tile), device) for x in xs]
                same = all(torch.equal(linear_triton.linear_fwd(x, w, None, torch.bfloat16, **decode_tile).view(torch.int16),
                                       want.view(torch.int16)) for x, want in zip(xs, wants))
            rows.append(("listed decode tile", listed, same))
            for c in candidates(args.quick, args.narrow):
                try:
                    same = all(torch.equal(swapped(x, w, **c).view(torch.int16), want.view(torch.int16)) for x, want in zip(xs, wants))
                    times = [graphed_ms(lambda x=x: swapped(x, w, **c), device) for x in xs]
                except Exception as error:  # noqa: BLE001  (out of resources)
                    print(f"  {c}: {type(error).__name__}", flush=True)
                    continue
                rows.append((f"swap {c['block_n']}x{c['block_m']}x{c['block_k']}/w{c['num_warps']}s{c['num_stages']}", times, same))
            print(f"{name:<17} N={n:<6} K={k:<5}", flush=True)
            head, rest = rows[:2], sorted(rows[2:], key=lambda r: r[1][0])
            for label, times, same in head + rest[:8]:
                bits = "" if same is None else ("bits equal" if same else "BITS DIFFER")
                print(f"    {label:<26} {' / '.join(f'{t:.4f}' for t in times)}  ({gbs(times[0]):.0f} GB/s)  {bits}", flush=True)
            print(f"    swapped candidates with bits equal: {sum(r[2] for r in rows[2:])}/{len(rows) - 2}", flush=True)


if __name__ == "__main__":
    main()
