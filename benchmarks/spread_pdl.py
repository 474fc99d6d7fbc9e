"""The spread decode's three kernels (`ops/attention/triton_blocks.py`) with programmatic dependent launch on or off
per kernel, and at a few program counts: each combination's time as a CUDA-graph replay beside the walk's, and its
bits against the walk's (elements whose int16 views differ: must be 0), at Qwen3-8B's heads as attention_blocks.py.

    cd benchmarks && PYTHONPATH=../src python3 spread_pdl.py [--sizes 1x2048,1x8192,4x2048,8x2048] [--waves 2,4,8]

A combination is written max/terms/fold, 1 where that kernel launches with PDL.
"""
import argparse
import itertools

import torch

from attention import PAGE_SIZE, _randn
from attention_blocks import HEADS
from isoexec.ops.attention import triton as attention_triton
from isoexec.ops.attention import triton_blocks
from isoexec.ops.attention.metadata import paged_slot_table
from timing import graphed_ms

KERNELS = (triton_blocks.block_max_kernel, triton_blocks.block_terms_kernel, triton_blocks.fold_kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1x2048,1x8192,4x2048,8x2048")
    parser.add_argument("--waves", default="2,4,8", help="PROGRAM_WAVES values")
    parser.add_argument("--out", help="append each row here too")
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    op = attention_triton.bench_op()
    saved = triton_blocks.BLOCKS_MIN, triton_blocks.BLOCKS_MAX_FILL, triton_blocks.PROGRAM_WAVES

    def run(call, blocks_min, fill, waves, pdl):
        triton_blocks.BLOCKS_MIN, triton_blocks.BLOCKS_MAX_FILL, triton_blocks.PROGRAM_WAVES = blocks_min, fill, waves
        for kernel, on in zip(KERNELS, pdl):
            kernel.dependent_launches = lambda device, on=on: on
        try:
            return op(*call)
        finally:
            triton_blocks.BLOCKS_MIN, triton_blocks.BLOCKS_MAX_FILL, triton_blocks.PROGRAM_WAVES = saved

    generator = torch.Generator(device=device).manual_seed(0)
    num_heads, num_kv_heads, head_dim = HEADS
    for size in args.sizes.split(","):
        batch, keys = map(int, size.split("x"))
        q = _randn(generator, batch, num_heads, head_dim, dtype=dtype)
        k, v = (_randn(generator, batch, num_kv_heads, keys, head_dim, dtype=dtype) for _ in range(2))
        pages = -(-keys // PAGE_SIZE)
        block_table = torch.randperm(batch * pages, generator=generator, device=device).view(batch, pages)
        slot_table = paged_slot_table(block_table, PAGE_SIZE, keys)
        k_store = torch.full((batch * pages * PAGE_SIZE, num_kv_heads, head_dim), float("nan"), device=device, dtype=dtype)
        v_store = k_store.clone()
        k_store[slot_table.flatten()] = k.transpose(1, 2).reshape(-1, num_kv_heads, head_dim)
        v_store[slot_table.flatten()] = v.transpose(1, 2).reshape(-1, num_kv_heads, head_dim)
        call = (q, k_store, v_store, slot_table, torch.arange(batch, device=device), torch.full((batch,), keys - 1, device=device),
                head_dim**-0.5)
        want = run(call, None, 0.0, saved[2], (True,) * 3).view(torch.int16)
        walk_ms = graphed_ms(lambda: run(call, None, 0.0, saved[2], (True,) * 3), device)
        parts = []
        for waves in map(int, args.waves.split(",")):
            for pdl in itertools.product((False, True), repeat=3):
                spread = lambda: run(call, 1, float("inf"), waves, pdl)  # noqa: E731
                differing = int((want != spread().view(torch.int16)).sum())
                ms = graphed_ms(spread, device)
                parts.append(f"w{waves} {''.join(str(int(p)) for p in pdl)} {ms * 1e3:.1f}" + (f" DIFFERING {differing}" if differing else ""))
        line = f"decode batch {batch} keys {keys}  walk {walk_ms * 1e3:.1f} us  spread (us): " + ", ".join(parts)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
