"""Where a decode call's time goes inside its CUDA graph: each kernel's duration and the gaps between kernels, per
replay, with L2 flushed before every replay (as `timing.graphed_ms` times it), for the contract's decode (the spread
decode's three kernels where it applies) and flash SDPA's, at Qwen3-8B's heads on attention_blocks.py's cases.

    cd benchmarks && PYTHONPATH=../src python3 attention_timeline.py [--sizes 1x2048,8x2048] [--knobs max_run=4] [--out FILE]

--knobs sets `attention_tiles.py`'s spread-decode knobs (name=value, comma-separated) for the whole run.

A row: the replay's span (first kernel's start to last kernel's end, median over replays), then each kernel in launch
order with its median duration and the median gap from the previous kernel's end to its start (negative: it started
before the previous ended, as a dependent launch may).
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from attention_blocks import case
from attention_spans import _emit
from attention_tiles import KNOBS, knob_value
from isoexec.ops.attention import triton as attention_triton

REPLAYS = 20


def timeline(fn, device: torch.device) -> str:
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            flush.zero_()
            graph.replay()
        torch.cuda.synchronize(device)
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type.name == "CUDA" and "FillFunctor" not in e.name)  # the flush's fill kernel
    per = len(kernels) // REPLAYS
    if per * REPLAYS != len(kernels):
        return f"({len(kernels)} kernel records over {REPLAYS} replays: not a whole number a replay)"
    replays = [kernels[r * per:(r + 1) * per] for r in range(REPLAYS)]
    span = statistics.median(r[-1][1] - r[0][0] for r in replays)
    parts = []
    for j in range(per):
        duration = statistics.median(r[j][1] - r[j][0] for r in replays)
        gap = statistics.median(r[j][0] - r[j - 1][1] for r in replays) if j else 0.0
        parts.append(f"{replays[0][j][2][:28]} {duration:.1f}" + (f" (gap {gap:+.1f})" if j else ""))
    return f"span {span:.1f} us: " + ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1x512,1x2048,1x8192,4x2048,8x2048")
    parser.add_argument("--knobs", default="", help="name=value items, comma-separated (attention_tiles.py's knob names)")
    parser.add_argument("--out", help="append each row here too")
    args = parser.parse_args()
    for item in filter(None, args.knobs.split(",")):
        name, value = item.split("=")
        module, constant = KNOBS[name]
        setattr(module, constant, knob_value(getattr(module, constant), int(value)))
    device = torch.device("cuda")
    op = attention_triton.bench_op()
    generator = torch.Generator(device=device).manual_seed(0)
    for size in args.sizes.split(","):
        batch, keys = map(int, size.split("x"))
        call, k, v = case(batch, keys, generator, device)
        q = call[0]
        _emit(f"decode {batch} x {keys}  contract {timeline(lambda: op(*call), device)}", args.out)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash = timeline(lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True, scale=q.shape[-1]**-0.5), device)
        _emit(f"decode {batch} x {keys}  flash    {flash}", args.out)


if __name__ == "__main__":
    main()
