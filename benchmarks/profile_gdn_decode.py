"""Where a gdn.core.triton decode step spends its GPU time, against flash-linear-attention's recurrent step,
and whether a tensor-core product's row keeps its bits in a smaller tile (what a decode step that computes
only its own row relies on).

    cd benchmarks && PYTHONPATH=../src python3 profile_gdn_decode.py
"""

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

from gdn import GPU, SHAPES, _cache, _contract_op, _fla, _fla_decode, _inputs


def _kernels(fn, label: str, reps: int = 20) -> None:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / reps
    print(f"== {label}: {total:.1f} us of kernels per call")
    for e in rows[:8]:
        print(f"   {e.device_time_total / reps:8.1f} us  {e.count // reps:3d}x  {e.key[:100]}")


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
    probe_tiles()
    profile_decode()
