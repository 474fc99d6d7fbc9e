"""Eager vs graph time of the preset's attention on short prefills: device time of the kernel (profiler), host
time per call, do_bench eager and graph; PDL on and off. PYTHONPATH=<tree>/src:benchmarks python3 attn_host.py"""
import os, time
import torch
from torch.profiler import profile, ProfilerActivity
from isoexec.ops.attention import packed_slot_table
from isoexec.ops.attention import triton as at
from timing import graphed_ms, kernel_ms

dev, dim = torch.device("cuda"), 128
g = torch.Generator().manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).to(dev)  # noqa: E731
op = at.bench_op()
for heads, kvh, num_seqs, length in ((32, 8, 1, 512), (32, 8, 3, 77), (32, 8, 1, 2048)):
    table, seq_ids, positions = packed_slot_table(torch.arange(num_seqs + 1, device=dev) * length)
    q, k, v = rnd(num_seqs * length, heads, dim), rnd(num_seqs * length, kvh, dim), rnd(num_seqs * length, kvh, dim)
    call = lambda: op(q, k, v, table, seq_ids, positions, dim ** -0.5)  # noqa: E731
    for pdl in ("1", "0"):
        os.environ["ISOEXEC_PDL"] = pdl
        call(); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            call()
        host = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                call()
            torch.cuda.synchronize()
        ev = [e for e in prof.events() if "attention" in e.name]
        dev_us = sorted(e.device_time for e in ev)[len(ev) // 2] if ev else float("nan")
        eager = kernel_ms(call, dev) * 1e3
        graph = graphed_ms(call, dev) * 1e3
        print(f"{num_seqs}x{length} PDL={pdl}: kernel on device {dev_us:.1f} us, host per call {host:.1f} us, do_bench eager {eager:.1f} us, graph {graph:.1f} us", flush=True)
