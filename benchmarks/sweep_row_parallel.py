"""Launches and tiles for linear.row_parallel.triton's sequential fold at large M, timed against cuBLAS
and compared bit for bit with the grid kernel at the listed tile (an experiment script,
docs/experiments.md; not a benchmark of record).

    PYTHONPATH=src:benchmarks python3 benchmarks/sweep_row_parallel.py [--m 1024 4096] [--leaves 8]

Two launches compute the same fold (`row_parallel_triton.fused_fwd` picks one per layer): `grid`, one
program per output tile with masked pointer loads in one loop over every leaf's blocks (`fused_kernel`),
and `persistent`, one program per SM loading its tiles through TMA, a loop per leaf (`persistent_triton`,
where each leaf is whole BLOCK_K blocks). A tile holds two fp32 accumulators (the leaf and the running
sum). The `bits` mark (*) says a candidate's output differs from the grid kernel's with the listed tile.
`--leaves 1` times the same launches without a fold (plain GEMMs), to see what the fold costs.
"""

import argparse
import json
import sys

import torch
import triton

from isoexec.ops.linear import persistent_triton, row_parallel_triton
from timing import kernel_ms

LAYERS = {"8b.o_proj": (4096, 4096), "8b.down_proj": (4096, 12288), "0.6b.o_proj": (1024, 2048), "0.6b.down_proj": (1024, 3072)}
TILES = [
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5),
    dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
    dict(block_m=64, block_n=256, block_k=64, num_warps=8, num_stages=4),
    dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
]


def launches(num_leaves):
    def grid(x, w, y, tile):
        row_parallel_triton.fused_grid(x, w, None, y, num_leaves=num_leaves, **tile)

    def persistent(x, w, y, tile):
        persistent_triton.linear_fwd_persistent(x, w, None, y, num_leaves=num_leaves, **tile)

    return {"grid": grid, "persistent": persistent}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument("--json", help="write every timing here")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(" ".join(sys.argv), torch.cuda.get_device_name(), "triton", triton.__version__)
    print("ratio = cuBLAS ms / candidate ms; * = bits differ from the grid kernel with the listed tile")
    rows = []
    for layer in args.layers:
        n, k = LAYERS[layer]
        listed = {key: v for key, v in row_parallel_triton.hopper_constants(n, k).items() if key.startswith(("block", "num_"))}
        for m in args.m:
            gen = torch.Generator(device=device).manual_seed(m + n + k)
            x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
            w = (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(torch.bfloat16)
            reference = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            launches(args.leaves)["grid"](x, w, reference, listed)
            cublas = kernel_ms(lambda: torch.nn.functional.linear(x, w), device)
            print(f"{layer:<15} M={m:<5} cuBLAS {cublas:.3f} ms ({2 * m * n * k / cublas / 1e9:.0f} TFLOP/s)  "
                  f"listed tile {listed['block_m']}x{listed['block_n']}x{listed['block_k']}")
            results = []
            for name, launch in launches(args.leaves).items():
                for tile in TILES:
                    y = torch.empty_like(reference)
                    try:
                        launch(x, w, y, tile)
                        ms = kernel_ms(lambda: launch(x, w, y, tile), device)
                    except Exception as error:  # a tile that does not compile or fit is a result too
                        print(f"    {name} {tile}: {type(error).__name__}: {str(error).splitlines()[0][:90]}")
                        continue
                    same = torch.equal(y.view(torch.int16), reference.view(torch.int16))
                    results.append((cublas / ms, same, name, tile, ms))
                    rows.append(dict(layer=layer, m=m, launch=name, **tile, ms=ms, cublas_ms=cublas, same_bits=same))
            for ratio, same, name, t, ms in sorted(results, key=lambda r: -r[0])[:8]:
                print(f"    {ratio:.3f}{' ' if same else '*'} {name:<11} {t['block_m']}x{t['block_n']}x{t['block_k']} "
                      f"w{t['num_warps']} s{t['num_stages']}  {ms:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
