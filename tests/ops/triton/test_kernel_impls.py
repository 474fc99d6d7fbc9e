"""The Triton impls of linear, rms_norm and logprobs together: the three register and check their
constants, refuse CPU tensors without the interpreter, and import and register nothing without
triton. Each family's own Triton tests are in tests/ops/{linear,rms_norm,logprobs}/test_triton.py;
what they share is in tests/ops/kernels_triton.py.
"""

import pytest
import torch

from conftest import INTERPRETER_WARNINGS, boundary, require_triton

require_triton()

from isoexec.ops import triton_support  # noqa: E402
from isoexec.ops.linear import tuning  # noqa: E402
from isoexec.ops.logprobs import tuning as logprobs_tuning  # noqa: E402
from isoexec.ops.rms_norm import tuning as rms_norm_tuning  # noqa: E402
from ops.kernels_triton import LINEAR, LOGPROBS, RMS_NORM, _registry, linear, logprobs, rms_norm  # noqa: E402
from ops.triton_impls import assert_import_and_register_nothing_without_triton  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]


# registration, refusal


def test_the_three_impls_register_and_check_their_constants():
    registry = _registry()
    impls = {impl.ref: impl for impl in registry}
    assert set(impls) == {"linear.triton@1", "rms_norm.triton@1", "rms_norm.residual.triton@1", "logprobs.triton@1"}
    impls["linear.triton@1"].check(boundary(LINEAR, torch.bfloat16))
    for constants, message in [({**LINEAR, "accum_dtype": "float64"}, "float32 only"), ({**LINEAR, "block_k": 24}, "power of two"),
                               ({**LINEAR, "block_tree": "sequential"}, "unsupported constants")]:
        with pytest.raises(ValueError, match=message):
            impls["linear.triton@1"].check(constants)
    with pytest.raises(ValueError, match="reduce_block must be a power of two"):
        impls["rms_norm.triton@1"].check({**RMS_NORM, "reduce_block": 48})
    with pytest.raises(ValueError, match="missing constants num_warps"):
        impls["logprobs.triton@1"].check({k: v for k, v in LOGPROBS.items() if k != "num_warps"})
    for n, k in ((64, 64), (1024, 4096), (6144, 4096), (4096, 12288), (151936, 4096)):
        for tiles in (tuning.hopper_tile(n, k), tuning.hopper_decode_tile(n, k) or {}):
            impls["linear.triton@1"].check(boundary(LINEAR, torch.bfloat16) | tiles)
    for tiles in map(rms_norm_tuning.hopper_constants, (16, 64, 128, 768, 1024, 2048, 4096, 5120)):
        impls["rms_norm.triton@1"].check(RMS_NORM | tiles)
    for tiles in map(logprobs_tuning.hopper_constants, (64, 512, 151936, 248320)):
        impls["logprobs.triton@1"].check(LOGPROBS | tiles)
    assert all(impl.source_sha256 for impl in impls.values())


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(triton_support, "interpreting", lambda: False)
    with pytest.raises(RuntimeError, match="linear.triton needs a CUDA device or TRITON_INTERPRET=1"):
        linear()(torch.randn(2, 16), torch.randn(3, 16))
    with pytest.raises(RuntimeError, match="rms_norm.triton needs a CUDA device"):
        rms_norm()(torch.randn(2, 16), torch.randn(16))
    with pytest.raises(RuntimeError, match="logprobs.triton needs a CUDA device"):
        logprobs()(torch.randn(2, 16))


def test_without_triton_the_modules_import_and_register_nothing():
    assert_import_and_register_nothing_without_triton("isoexec.ops.linear.triton", "isoexec.ops.rms_norm.triton", "isoexec.ops.logprobs.triton")
