"""A persistent launch of linear.triton's tile arithmetic: a candidate, timed by benchmarks/bench.py.

`linear_fwd_kernel` launches one program per output tile. Here a fixed number of programs (one per
SM, or fewer when there are fewer tiles) each loop over tiles `pid, pid + P, pid + 2P, …`, taken in
grouped order (GROUP_M tile rows per band, so consecutive tiles share weight columns in L2). For each
tile it calls `linear_triton.linear_tile`, the function `linear_fwd_kernel` calls: the same ascending
BLOCK_K walk into one fp32 accumulator from +0.0, the same bias add and single rounding. Which program
computes a tile, and when, cannot enter a tile's arithmetic, so the output must be bitwise the
`linear.triton` output for the same tile constants; `tests/ops/test_triton_kernels.py` checks it.

Not registered: it becomes part of `linear.triton` only if it is measured faster on the GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import triton_support
from ..triton_support import jit, tl, triton
from . import triton as linear_triton

GROUP_M = 8


@jit(do_not_specialize=["M", "num_programs"])
def linear_persistent_kernel(
    x, w, b, y,
    M, N, num_programs,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    K: tl.constexpr,
    NK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
):
    num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tile = tl.program_id(0)
    while tile < num_m * num_n:  # a while loop: the interpreter cannot take a runtime `range` bound
        band = tile // (GROUP * num_n)
        first_m = band * GROUP
        rows_in_band = tl.minimum(num_m - first_m, GROUP)
        i_m = first_m + tile % rows_in_band
        i_n = (tile % (GROUP * num_n)) // rows_in_band

        linear_triton.linear_tile(x, w, b, y, i_m, i_n, M, N, stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                                  K, NK, HAS_BIAS, DOT_IN_FP32, BLOCK_M, BLOCK_N, BLOCK_K)
        tile += num_programs


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def linear_fwd_persistent(x: Tensor, weight: Tensor, bias: Tensor | None, out_dtype: torch.dtype, *, block_m: int, block_n: int,
                          block_k: int, num_warps: int, num_stages: int) -> Tensor:
    """x [M, K], weight [N, K], bias [N] -> [M, N] in `out_dtype`; the bits of `linear_triton.linear_fwd`."""
    m, k = x.shape
    n = weight.shape[0]
    y = x.new_empty((m, n), dtype=out_dtype)
    if m == 0 or n == 0:
        return y
    num_programs = min(_num_sms(x.device), triton.cdiv(m, block_m) * triton.cdiv(n, block_n))
    linear_persistent_kernel[(num_programs,)](
        x, weight, x if bias is None else bias.contiguous(), y,
        m, n, num_programs,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        K=k, NK=triton.cdiv(k, block_k), HAS_BIAS=bias is not None, DOT_IN_FP32=triton_support.interpreting(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=GROUP_M, num_warps=num_warps, num_stages=num_stages,
    )
    return y


def bench_op():
    """linear.triton's Hopper tiles, launched persistently: what `benchmarks/bench.py gemm` times beside it."""
    def op(x, w, b=None):
        constants = linear_triton.hopper_constants(*w.shape, str(x.dtype).removeprefix("torch."))
        tiles = {k: constants[k] for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
        return linear_fwd_persistent(x, w, b, x.dtype, **tiles)
    return op
