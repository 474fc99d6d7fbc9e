"""What the Triton tests of linear, rms_norm and logprobs share: their float32 constants, the calls, a
strided layout with NaN gaps, the registry of the three impls, the battery's reduced probes (the linear
one serves tests/ops/linear/test_row_parallel_triton.py too), and the check that the battery admits an
impl, which each family's tests/ops/{linear,rms_norm,logprobs}/test_triton.py runs for its own region.
The tests that cover the three at once are in tests/ops/triton/test_kernel_impls.py.

Import it only after `conftest.require_triton()`: it imports the Triton modules.
"""

import torch

from conftest import ON_GPU, boundary
from isoexec.ops.linear import probe as linear_probe
from isoexec.ops.linear import triton as linear_triton
from isoexec.ops.linear import tuning as linear_tuning
from isoexec.ops.logprobs import probe as logprobs_probe
from isoexec.ops.logprobs import triton as logprobs_triton
from isoexec.ops.rms_norm import probe as rms_norm_probe
from isoexec.ops.rms_norm import triton as rms_norm_triton
from isoexec.runtime.registry import Registry
from isoexec.validate.battery import hazard_rows, rowwise
from ops.triton_impls import SMALL_SIZES, assert_admitted, registry_of, validate_pinned

LINEAR = dict(input_dtype="float32", weight_dtype="float32", output_dtype="float32", accum_dtype="float32", block_m=32,
              block_n=32, block_k=16, num_warps=4, num_stages=2)
RMS_NORM = dict(input_dtype="float32", output_dtype="float32", accum_dtype="float32", reduce_block=32, num_warps=1)
LOGPROBS = dict(input_dtype="float32", output_dtype="float32", accum_dtype="float32", vocab_block=64, num_warps=4)


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout, the gaps NaN so an unmasked read shows."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def linear(constants=LINEAR):
    return lambda x, w, b=None: linear_triton.linear(x, w, b, **constants)


def rms_norm(constants=RMS_NORM):
    return lambda x, w, eps=1e-6, zero_centered=False: rms_norm_triton.rms_norm(x, w, eps, zero_centered, **constants)


def logprobs(constants=LOGPROBS):
    return lambda x: logprobs_triton.logprobs(x, **constants)


# registration, admission


def _registry() -> Registry:
    return registry_of(linear_triton, rms_norm_triton, logprobs_triton)


def _small_linear_probe(ctx):
    """linear's probe with fewer rows and batch sizes, for the interpreter (linear.row_parallel's too)."""
    k, n = linear_probe.K, linear_probe.N
    x = torch.cat([ctx.randn(10, k), hazard_rows(ctx, k)])
    weight, bias = ctx.randn(n, k, scale=k**-0.5), ctx.randn(n)
    yield from rowwise(ctx, [x], weight, bias, sizes=SMALL_SIZES)
    yield from rowwise(ctx, [x], weight, None, sizes=(7,), label="without bias")


def _small_rms_norm_probe(ctx):
    """rms_norm's probe with fewer rows and batch sizes, for the interpreter."""
    x = torch.cat([ctx.randn(10, rms_norm_probe.HIDDEN), hazard_rows(ctx, rms_norm_probe.HIDDEN)])
    weight = ctx.randn(rms_norm_probe.HIDDEN)
    yield from rowwise(ctx, [x], weight, 1e-6, sizes=SMALL_SIZES)
    yield from rowwise(ctx, [x], weight, 1e-5, True, sizes=(7,), label="zero-centred")


def _small_logprobs_probe(ctx):
    """logprobs' probe at one width (two vocab blocks, the last padded) with fewer rows and batch sizes,
    for the interpreter."""
    width = ctx.constants["vocab_block"] + 20
    logits = torch.cat([ctx.randn(2, width, scale=3.0), hazard_rows(ctx, width), logprobs_probe.edge_rows(ctx, width)])
    yield from rowwise(ctx, [logits], sizes=SMALL_SIZES, label=f"V = {width}")


BATTERY = {
    "linear": ("linear.triton", boundary(LINEAR, torch.bfloat16) | linear_tuning.hopper_tile(64, 64), linear_probe.probe,
               _small_linear_probe),
    "rms_norm": ("rms_norm.triton", boundary(RMS_NORM, torch.bfloat16) | {"reduce_block": 64}, rms_norm_probe.probe,
                 _small_rms_norm_probe),
    "logprobs": ("logprobs.triton", boundary(LOGPROBS, torch.bfloat16) | {"vocab_block": 128}, logprobs_probe.probe,
                 _small_logprobs_probe),
}


def assert_the_battery_admits(region: str) -> None:
    """`region`'s Triton impl with its BATTERY constants: the family's own probe on a GPU, the reduced one
    under the interpreter."""
    impl_id, constants, gpu_probe, interpreter_probe = BATTERY[region]
    result = validate_pinned(region, impl_id, constants, gpu_probe if ON_GPU else interpreter_probe, _registry())
    assert_admitted(result, min_trials=60)
