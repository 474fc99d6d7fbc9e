"""Candidate launch schemes for linear.triton's tile at large M, timed against cuBLAS and compared bit
for bit with the registered kernel (an experiment script, docs/experiments.md; not a benchmark of record).

    PYTHONPATH=src:benchmarks python3 benchmarks/sweep_gemm.py [--m 1024 4096] [--quick]

Every candidate walks K in ascending BLOCK_K blocks into one fp32 accumulator starting from +0.0 and
rounds once, as `linear_tile` does; they differ only in how a tile is addressed and loaded:
- `masked`: the registered kernel (`linear_fwd_kernel`: 2-D grid, masked loads, int64 offsets);
- `wrapped`: rows and columns past M and N wrap around (`% M`), so only the K tail is masked and the
  pointers advance by BLOCK_K; grouped tile order (GROUP_M tile rows per band) for L2 reuse;
- `tma`: x and W tiles loaded through host-built TMA descriptors (out-of-bounds boxes read +0.0),
  grouped order;
- `tma_persistent`: the same tiles, one program per SM looping over them.
A row's bits may depend on BLOCK_K (the order of the fp32 accumulation) but, if the tensor core adds
each BLOCK_K slab the same way, not on BLOCK_M / BLOCK_N or the load path: the `bits` column says
whether each candidate's output equals the registered kernel's with its listed tile.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from isoexec.ops.linear import triton as linear_triton
from timing import kernel_ms

QWEN3_8B = {"qkv_proj": (6144, 4096), "q_proj": (4096, 4096), "k_proj": (1024, 4096), "gate_proj": (12288, 4096), "down_proj": (4096, 12288),
            "lm_head": (151936, 4096)}
GROUP_M = 8
TILES = [
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
    dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4),
    dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
    dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4),
    dict(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
    dict(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4),
    dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
    dict(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=4),
]


@triton.jit
def _grouped(tile, num_m, num_n, GROUP: tl.constexpr):
    band = tile // (GROUP * num_n)
    first_m = band * GROUP
    rows_in_band = tl.minimum(num_m - first_m, GROUP)
    return first_m + tile % rows_in_band, (tile % (GROUP * num_n)) // rows_in_band


@triton.jit(do_not_specialize=["M"])
def wrapped_kernel(x, w, y, M, N, stride_xm, stride_wn, stride_ym,
                   K: tl.constexpr, NK: tl.constexpr, EVEN_K: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    i_m, i_n = _grouped(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    p_x = x + (o_m % M)[:, None] * stride_xm + o_k[None, :]
    p_w = w + o_k[:, None] + (o_n % N)[None, :] * stride_wn
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i_k in range(0, NK):
        if EVEN_K:
            b_x, b_w = tl.load(p_x), tl.load(p_w)
        else:
            m_k = i_k * BLOCK_K + o_k < K
            b_x = tl.load(p_x, mask=m_k[None, :], other=0.0)
            b_w = tl.load(p_w, mask=m_k[:, None], other=0.0)
        b_acc = tl.dot(b_x, b_w, b_acc)
        p_x += BLOCK_K
        p_w += BLOCK_K
    p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, b_acc.to(y.dtype.element_ty), mask=(o_m < M)[:, None] & (o_n < N)[None, :])


@triton.jit(do_not_specialize=["M"])
def tma_kernel(x_desc, w_desc, y, M, N, stride_ym, NK: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    i_m, i_n = _grouped(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP)
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i_k in range(0, NK):
        b_x = x_desc.load([i_m * BLOCK_M, i_k * BLOCK_K])  # [BLOCK_M, BLOCK_K]
        b_w = w_desc.load([i_n * BLOCK_N, i_k * BLOCK_K])  # [BLOCK_N, BLOCK_K]
        b_acc = tl.dot(b_x, b_w.T, b_acc)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, b_acc.to(y.dtype.element_ty), mask=(o_m < M)[:, None] & (o_n < N)[None, :])


@triton.jit(do_not_specialize=["M", "num_programs"])
def tma_persistent_kernel(x_desc, w_desc, y, M, N, stride_ym, num_programs, NK: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_m * num_n, num_programs, flatten=True):
        i_m, i_n = _grouped(tile, num_m, num_n, GROUP)
        b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for i_k in range(0, NK):
            b_x = x_desc.load([i_m * BLOCK_M, i_k * BLOCK_K])
            b_w = w_desc.load([i_n * BLOCK_N, i_k * BLOCK_K])
            b_acc = tl.dot(b_x, b_w.T, b_acc)
        o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
        o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
        p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
        tl.store(p_y, b_acc.to(y.dtype.element_ty), mask=(o_m < M)[:, None] & (o_n < N)[None, :])


def wrapped(x, w, *, block_m, block_n, block_k, num_warps, num_stages):
    m, k = x.shape
    n = w.shape[0]
    y = x.new_empty(m, n)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    wrapped_kernel[grid](x, w, y, m, n, x.stride(0), w.stride(0), y.stride(0), K=k, NK=triton.cdiv(k, block_k),
                         EVEN_K=k % block_k == 0, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M,
                         num_warps=num_warps, num_stages=num_stages)
    return y


def tma(x, w, *, block_m, block_n, block_k, num_warps, num_stages, persistent=False):
    m, k = x.shape
    n = w.shape[0]
    y = x.new_empty(m, n)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w, [block_n, block_k])
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    common = dict(NK=triton.cdiv(k, block_k), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M,
                  num_warps=num_warps, num_stages=num_stages)
    if persistent:
        programs = min(tiles, torch.cuda.get_device_properties(x.device).multi_processor_count)
        tma_persistent_kernel[(programs,)](x_desc, w_desc, y, m, n, y.stride(0), programs, **common)
    else:
        tma_kernel[(tiles,)](x_desc, w_desc, y, m, n, y.stride(0), **common)
    return y


def masked(x, w, **tile):
    return linear_triton.linear_fwd(x, w, None, x.dtype, **tile)


CANDIDATES = {"masked": masked, "wrapped": wrapped, "tma": tma, "tma_persistent": lambda x, w, **t: tma(x, w, persistent=True, **t)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--layers", nargs="+", default=list(QWEN3_8B)[1:], choices=list(QWEN3_8B))
    args = parser.parse_args()
    device = torch.device("cuda")
    print(" ".join(sys.argv), torch.cuda.get_device_name(), "triton", triton.__version__)
    print("ratio = cuBLAS ms / candidate ms; * = bits differ from linear.triton with its listed tile")
    for layer in args.layers:
        n, k = QWEN3_8B[layer]
        listed = {key: linear_triton.hopper_constants(n, k)[key] for key in TILES[0]}
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        for m in args.m:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            cublas = kernel_ms(lambda: F.linear(x, w), device)
            want = masked(x, w, **listed).view(torch.int16)
            results = []
            for tile in TILES:
                for name, fn in CANDIDATES.items():
                    try:
                        same = torch.equal(fn(x, w, **tile).view(torch.int16), want)
                        ms = kernel_ms(lambda: fn(x, w, **tile), device)
                    except Exception as error:  # out of shared memory or registers
                        print(f"  {layer} M={m} {name} {tile}: {type(error).__name__}: {str(error).splitlines()[0][:90]}")
                        continue
                    results.append((cublas / ms, same, name, tile))
            tflops = 2 * m * n * k / cublas / 1e9
            print(f"{layer:<9} M={m:<5} cuBLAS {cublas:.3f} ms ({tflops:.0f} TFLOP/s)  listed tile {listed['block_m']}x{listed['block_n']}x{listed['block_k']}")
            for ratio, same, name, t in sorted(results, key=lambda r: -r[0]):
                print(f"    {ratio:.3f}{' ' if same else '*'} {name:<15} {t['block_m']}x{t['block_n']}x{t['block_k']} w{t['num_warps']} s{t['num_stages']}",
                      flush=True)


if __name__ == "__main__":
    main()
