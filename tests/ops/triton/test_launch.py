"""The launch cache of compiled Triton kernels (`ops/triton_launch.py`).

On any machine: its argument key separates every pair of arguments that Triton's own specialization
separates (else a cached launch could run a kernel compiled for other arguments). On a GPU: launches
through the cache give the bits of Triton's own path, and a new argument key compiles anew.
"""

import itertools

import pytest
import torch

from conftest import ON_GPU

pytest.importorskip("triton")

from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from isoexec.ops.triton_launch import Uncached, arg_key  # noqa: E402

pytestmark = pytest.mark.gpu


def _arguments() -> list:
    base = torch.zeros(64, 256, dtype=torch.bfloat16)
    values = [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 16, 2**31, 2**31 + 1, -(2**31), -(2**31) - 1, 2**63 - 16, 2**63, 2**64 - 16,
              0.0, 1.0, 1e-6, True, False, None]
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.int32, torch.uint8):
        t = torch.zeros(64, dtype=dtype)
        values += [t, t[1:], t[16:]]  # aligned, misaligned (for every dtype), aligned again
    values += [TensorDescriptor.from_tensor(base, [64, 64]), TensorDescriptor.from_tensor(base, [32, 64]),
               TensorDescriptor.from_tensor(base.float(), [64, 64]), TensorDescriptor.from_tensor(base[:32], [64, 64]),
               TensorDescriptor.from_tensor(base, [64, 64], padding="nan")]
    return values


def _triton_spec(value, specialize: bool = True):
    return native_specialize_impl(CUDABackend, value, False, specialize, True)


def test_key_separates_what_triton_specializes():
    values = _arguments()
    separated = 0
    for a, b in itertools.combinations(values, 2):
        for specialize in (True, False):  # do_not_specialize ints get the same key: it must separate those too
            if _triton_spec(a, specialize) != _triton_spec(b, specialize):
                separated += 1
                assert arg_key(a) != arg_key(b), (a, b, _triton_spec(a, specialize), _triton_spec(b, specialize))
    assert separated > 500  # the comparison is not vacuous


def test_other_arguments_take_tritons_path():
    with pytest.raises(Uncached):
        arg_key("a string")
    with pytest.raises(Uncached):
        arg_key([1, 2])


@pytest.mark.skipif(not ON_GPU, reason="launches compiled kernels")
def test_cached_launches_give_tritons_bits():
    from isoexec.ops.linear import triton as linear_triton

    kernel = linear_triton.linear_fwd_kernel
    tiles = dict(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 97, generator=g).cuda()  # fp32 rows of K = 97 (388 bytes): the grid kernel
    w = torch.randn(50, 97, generator=g).cuda()

    def bits(y):
        return y.view(torch.int32)

    def own_path(xx):  # Triton's JITFunction.run, bypassing the cache
        y = xx.new_empty(1, xx.shape[0], w.shape[0])
        original = kernel.run
        kernel.run = lambda *a, **k: JITFunction.run(kernel, *a, **k)
        try:
            linear_triton.launch(xx, w, None, y, **tiles)
        finally:
            kernel.run = original
        return y[0]

    kernel.launches.clear()
    first = linear_triton.linear_fwd(x, w, None, torch.float32, **tiles)  # compiles, through Triton's path
    second = linear_triton.linear_fwd(x, w, None, torch.float32, **tiles)  # through the cache
    assert len(kernel.launches) == 1
    want = own_path(x)
    assert torch.equal(bits(first), bits(want)) and torch.equal(bits(second), bits(want))
    # The comparison can see a difference: the same GEMM split in two K halves summed in fp32. (cuBLAS
    # gave this small bf16 GEMM's bits exactly on an H200, so it is no control here.)
    split = sum(linear_triton.linear_fwd(x[:, ks], w[:, ks], None, torch.float32, **tiles) for ks in (slice(0, 48), slice(48, 97)))
    assert not torch.equal(bits(split), bits(want))

    shifted = torch.empty(37 * 97 + 1, device="cuda")[1:].view(37, 97)  # a 4-byte aligned x
    shifted.copy_(x)
    assert shifted.data_ptr() % 16
    keys = len(kernel.launches)
    for _ in range(2):
        got = linear_triton.linear_fwd(shifted, w, None, torch.float32, **tiles)
    assert len(kernel.launches) == keys + 1  # a new key, compiled once
    assert torch.equal(bits(got), bits(want))
