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
    x = torch.randn(37, 97, generator=g).to(torch.bfloat16).cuda()  # K = 97: the grid kernel
    w = torch.randn(50, 97, generator=g).to(torch.bfloat16).cuda()

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
    first = linear_triton.linear_fwd(x, w, None, torch.bfloat16, **tiles)  # compiles, through Triton's path
    second = linear_triton.linear_fwd(x, w, None, torch.bfloat16, **tiles)  # through the cache
    assert len(kernel.launches) == 1
    want = own_path(x)
    assert torch.equal(first.view(torch.int16), want.view(torch.int16))
    assert torch.equal(second.view(torch.int16), want.view(torch.int16))
    native = torch.nn.functional.linear(x, w)  # cuBLAS: the comparison can see a difference
    assert not torch.equal(native.view(torch.int16), want.view(torch.int16))

    shifted = torch.empty(37 * 97 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(37, 97)  # a 2-byte aligned x
    shifted.copy_(x)
    assert shifted.data_ptr() % 16
    for _ in range(2):
        got = linear_triton.linear_fwd(shifted, w, None, torch.bfloat16, **tiles)
    assert len(kernel.launches) == 2
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
