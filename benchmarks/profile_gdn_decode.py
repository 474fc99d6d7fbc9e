"""Where a gdn.core.triton decode step spends its GPU time, against flash-linear-attention's recurrent step,
and whether a tensor-core product's row keeps its bits in a smaller tile (what a decode step that computes
only its own row relies on). `--part rows`: the kernels of one chunk of decode steps (16 from a chunk's first offset,
replayed as one CUDA graph, as `bench.py gdn` times "decode chunk") by the op with each inverse, by
`gdn_rows_decode.py`'s standalone kernel and by FLA's recurrent step: how many launch a step and each one's device time,
which says whether the op's step costs more than the standalone kernel inside its kernel or around it.

    cd benchmarks && PYTHONPATH=../src python3 profile_gdn_decode.py [--part all|rows] [--batches 1,4] [--shape hk16-hv16-d128]
"""

import argparse

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

from gdn import GPU, SHAPES, _cache, _contract_op, _fla, _fla_decode, _inputs


def _kernels(fn, label: str, reps: int = 20, per: int = 1) -> None:
    """fn's kernels, their count and device time per call (per `per`-th of a call: fn makes `per` steps)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / (reps * per)
    print(f"== {label}: {total:.2f} us of kernels per {'step' if per > 1 else 'call'}")
    for e in rows[:8]:
        print(f"   {e.device_time_total / (reps * per):8.2f} us  {e.count / (reps * per):5.2f}x  {e.key[:100]}")


def profile_rows_step(batches: list[int], timed: bool = True, only: str = "", shape_name: str = "hk16-hv32-d128") -> None:
    """Graph replays of a chunk of decode steps: the kernels each impl launches a step and their device time."""
    from gdn import TOKEN_INPUTS
    from gdn_rows_decode import rows_step, split_block
    from timing import graphed_ms

    device = torch.device("cuda")
    fla, why = _fla()
    shape = SHAPES[shape_name]
    hk, hv, dk, dv = shape
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    ops = {inverse: _contract_op(GPU["contract"], inverse=inverse) for inverse in ("products", "rows")}
    chunk = ops["rows"][1].constants["chunk_size"]
    for batch in batches:
        generator = torch.Generator(device=device).manual_seed(batch)
        x = _inputs(shape, batch * chunk, device, generator)
        steps = [{n: (t[i * batch:(i + 1) * batch] if n in TOKEN_INPUTS else t) for n, t in x.items()} for i in range(chunk)]
        positions = [torch.full((batch,), 2048 + i, device=device) for i in range(chunk)]
        ids = torch.arange(batch, device=device)
        fns = {}
        for inverse, (op, _, row_width) in ops.items():  # each inverse's cache rows from the same seed (their own widths)
            state, cache_rows = _cache(shape, batch, chunk, row_width(hv, dk, dv), device, torch.Generator(device=device).manual_seed(7))
            fns[f"op, inverse {inverse}"] = lambda op=op, s=state, r=cache_rows: [
                op(t["q"], t["k"], t["v"], t["a"], t["b"], t["a_log"], t["dt_bias"], s, r, ids, p) for t, p in zip(steps, positions)]
        block = split_block(batch * hv, dv, sms)
        slot, t_slot = torch.zeros(batch, chunk, hv, dk + dv + 16, device=device), torch.zeros(batch, chunk, hv, chunk, device=device)
        fns[f"standalone rows kernel, block {block}"] = lambda s=state.clone(): [
            rows_step("rows", block, chunk, t, s, slot, t_slot, p) for t, p in zip(steps, positions)]
        if fla is not None:
            def fla_chunk(s=state.clone()):
                for t in steps:
                    _fla_decode(fla, t, s)
            fns["fla recurrent step"] = fla_chunk
        for label, fn in fns.items():
            if only not in label:
                continue
            with torch.no_grad():
                per_step = graphed_ms(fn, device) * 1e3 / chunk if timed else float("nan")
                side = torch.cuda.Stream(device)
                graph = torch.cuda.CUDAGraph()
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    fn()
                torch.cuda.current_stream(device).wait_stream(side)
                with torch.cuda.graph(graph):
                    fn()
                _kernels(graph.replay, f"batch {batch} {label} ({per_step:.2f} us a step replayed)", per=chunk)
    if fla is None:
        print("no FLA:", why)


def profile_decode() -> None:
    device = torch.device("cuda")
    op, entry, row_width = _contract_op(GPU["contract"])
    chunk = entry.constants["chunk_size"]
    fla, why = _fla()
    generator = torch.Generator(device=device).manual_seed(0)
    shape = SHAPES["hk16-hv32-d128"]
    width = row_width(shape[1], shape[2], shape[3])
    for batch in (1, 64, 256):
        for context in (2048, 2048 + chunk - 1):
            x = _inputs(shape, batch, device, generator)
            ids = torch.arange(batch, device=device, dtype=torch.int32)
            positions = torch.full((batch,), context, device=device, dtype=torch.int32)
            state, rows = _cache(shape, batch, chunk, width, device, generator)
            with torch.no_grad():
                _kernels(lambda: op(x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"], state, rows, ids, positions),
                         f"contract decode batch {batch} context {context}")
                if fla is not None and context == 2048:
                    s = state.clone()
                    _kernels(lambda: _fla_decode(fla, x, s), f"fla decode batch {batch}")
    if fla is None:
        print("no FLA:", why)


@triton.jit
def _dot_kernel(a, b, out, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, PREC: tl.constexpr):
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    x = tl.load(a + m[:, None] * K + k[None, :])
    y = tl.load(b + k[:, None] * N + n[None, :])
    if PREC == 2:
        z = tl.dot(x.to(tl.bfloat16), y.to(tl.bfloat16))
    elif PREC == 1:
        z = tl.dot(x, y, input_precision="tf32")
    else:
        z = tl.dot(x, y, input_precision="ieee")
    tl.store(out + m[:, None] * N + n[None, :], z)


def probe_tiles() -> None:
    """Row i of A @ B from a 32- or 64-row tile vs the same row alone (others zero) in a 16-row tile, at
    several warp counts: differing elements per (shape, precision, warps)."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(1)
    for K, N in ((32, 32), (64, 64), (128, 128), (32, 128), (128, 32)):
        for prec in (2, 1):
            a = torch.randn(64, K, generator=gen, device=device)
            b = torch.randn(K, N, generator=gen, device=device)
            ref = {}
            for big, warps in ((32, 4), (32, 8), (64, 4), (64, 8)):
                o = torch.empty(big, N, device=device)
                _dot_kernel[(1,)](a[:big].contiguous(), b, o, M=big, K=K, N=N, PREC=prec, num_warps=warps)
                ref[(big, warps)] = o
            base = ref[(32, 8)]
            diffs = {f"M{m}w{w}": int((ref[(m, w)][:32].view(torch.int32) != base.view(torch.int32)).sum()) for m, w in ref}
            for warps in (1, 2, 4, 8):
                bad = 0
                for i in range(32):
                    for slot in (0, 7, 15):
                        tile = torch.zeros(16, K, device=device)
                        tile[slot] = a[i]
                        o = torch.empty(16, N, device=device)
                        _dot_kernel[(1,)](tile, b, o, M=16, K=K, N=N, PREC=prec, num_warps=warps)
                        bad += int((o[slot].view(torch.int32) != base[i].view(torch.int32)).sum())
                diffs[f"M16w{warps}"] = bad
            print(f"K {K:3d} N {N:3d} {'bf16' if prec == 2 else 'tf32'}: differing elements vs M32w8: {diffs}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "rows"), default="all")
    parser.add_argument("--batches", default="1,4", help="--part rows: decode batches")
    parser.add_argument("--untimed", action="store_true", help="--part rows: no graph timing (under a profiler such as ncu)")
    parser.add_argument("--only", default="", help="--part rows: the impls whose label contains this")
    parser.add_argument("--shape", default="hk16-hv32-d128", choices=sorted(SHAPES), help="--part rows: the GDN heads (bench.py gdn's shapes)")
    args = parser.parse_args()
    if args.part == "rows":
        profile_rows_step([int(b) for b in args.batches.split(",")], timed=not args.untimed, only=args.only, shape_name=args.shape)
    else:
        probe_tiles()
        profile_decode()
