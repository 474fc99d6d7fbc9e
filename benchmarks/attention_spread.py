"""The spread decode (`ops/attention/triton_blocks.py`) under its launch choices: each one's time as a CUDA-graph replay
beside the walk's, and its bits against the walk's (elements whose int16 views differ: must be 0), at Qwen3-8B's heads
on attention_blocks.py's cases.

    cd benchmarks && PYTHONPATH=../src python3 attention_spread.py [pdl] [fold] [blocks] [kernels] [--sizes 1x2048,...] [--out FILE]

- pdl: programmatic dependent launch on or off per kernel (written max/terms/fold, 1 where that kernel launches with
  PDL), at 2, 4 and 8 programs an SM (PROGRAM_WAVES);
- fold: the fold's columns split over FOLD_SPLIT programs of FOLD_WARPS warps (FOLD_MAX_SPLIT set to the same, so
  that no call splits further), FOLD_UNROLL blocks an iteration (split x warps x unroll);
- blocks: the blocks kernels' loads in flight (BLOCK_STAGES 1-3) at 4, 8 and 16 programs an SM (stages x waves);
- kernels: each kernel's mean GPU time (torch.profiler over eager calls) at the defaults.
"""
import argparse
import itertools

import torch
from torch.profiler import ProfilerActivity, profile

from attention_blocks import case
from isoexec.ops import triton_support
from isoexec.ops.attention import triton as attention_triton
from isoexec.ops.attention import triton_blocks
from timing import graphed_ms

KERNELS = (triton_blocks.block_max_kernel, triton_blocks.block_terms_kernel, triton_blocks.fold_kernel)
FOLDS = ((1, 4, 1), (1, 4, 2), (1, 4, 4), (2, 4, 1), (4, 4, 1), (4, 2, 1), (4, 2, 4), (8, 1, 1), (8, 1, 4), (16, 1, 1), (16, 1, 4),
         (32, 1, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="*", default=["pdl", "fold", "blocks", "kernels"])
    parser.add_argument("--sizes", default="1x2048,1x2000,1x8192,4x2048,8x2048",
                        help="batch x keys, comma-separated (keys that are no multiple of 4 blocks of 32 end the fold mid-iteration)")
    parser.add_argument("--out", help="append each row here too")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run in the interpreter")
    args = parser.parse_args()
    device = torch.device(args.device)
    op = attention_triton.bench_op()
    names = ("BLOCKS_MIN", "BLOCKS_MAX_FILL", "PROGRAM_WAVES", "FOLD_SPLIT", "FOLD_MAX_SPLIT", "FOLD_WARPS", "FOLD_UNROLL", "BLOCK_STAGES")
    defaults = {name: getattr(triton_blocks, name) for name in names}
    default_pdl = tuple(getattr(kernel, "dependent_launches", None) is not None for kernel in KERNELS)

    def run(call, pdl=default_pdl, **settings):
        for name, value in (defaults | settings).items():
            setattr(triton_blocks, name, value)
        for kernel, on, dependent in zip(KERNELS, pdl, default_pdl):
            if dependent:  # a kernel declared without PDL has no PDL parameter to set
                kernel.dependent_launches = lambda device, on=on: on and triton_support.dependent_launches(device)
        try:
            return op(*call)
        finally:
            for name, value in defaults.items():
                setattr(triton_blocks, name, value)

    spread = dict(BLOCKS_MIN=1, BLOCKS_MAX_FILL=float("inf"))

    def emit(line: str) -> None:
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")

    generator = torch.Generator(device=device).manual_seed(0)
    for size in args.sizes.split(","):
        batch, keys = map(int, size.split("x"))
        call, _, _ = case(batch, keys, generator, device)
        want = run(call, BLOCKS_MIN=None).view(torch.int16)
        walk_ms = graphed_ms(lambda: run(call, BLOCKS_MIN=None), device)

        def timed(label, **settings):
            differing = int((want != run(call, **settings).view(torch.int16)).sum())
            ms = graphed_ms(lambda: run(call, **settings), device)
            return f"{label} {ms * 1e3:.1f}" + (f" DIFFERING {differing}" if differing else "")

        head = f"decode batch {batch} keys {keys}  walk {walk_ms * 1e3:.1f} us"
        if "pdl" in args.what:
            parts = [timed(f"w{waves} {''.join(str(int(p)) for p in pdl)}", pdl=pdl, PROGRAM_WAVES=waves, **spread)
                     for waves in (2, 4, 8) for pdl in itertools.product((False, True), repeat=3)]
            emit(f"{head}  spread by PDL (us): " + ", ".join(parts))
        if "fold" in args.what:
            parts = [timed(f"{split}x{warps}x{unroll}", FOLD_SPLIT=split, FOLD_MAX_SPLIT=split, FOLD_WARPS=warps, FOLD_UNROLL=unroll, **spread)
                     for split, warps, unroll in FOLDS]
            emit(f"{head}  spread by fold split x warps x unroll (us): " + ", ".join(parts))
        if "blocks" in args.what:
            parts = [timed(f"{stages}x{waves}", BLOCK_STAGES=stages, PROGRAM_WAVES=waves, **spread) for stages in (1, 2, 3) for waves in (4, 8, 16)]
            emit(f"{head}  spread by block stages x programs an SM (us): " + ", ".join(parts))
        if "kernels" in args.what and device.type == "cuda":
            run(call, **spread)
            torch.cuda.synchronize()
            reps = 20
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    run(call, **spread)
                torch.cuda.synchronize()
            times = {}
            for event in prof.events():
                if event.device_type.name == "CUDA" and "kernel" in event.name:
                    times[event.name] = times.get(event.name, 0.0) + event.device_time / reps
            emit(f"{head}  spread kernels (us, eager): " + ", ".join(f"{name} {us:.1f}" for name, us in times.items()))


if __name__ == "__main__":
    main()
