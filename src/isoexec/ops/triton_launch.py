"""Cheaper repeat launches of a compiled Triton kernel: a launch cache keyed on what Triton specializes on.

`kernel[grid](*args, **kwargs)` in Triton 3.6 spends ~40 us of host time per call on an H200 host, half of
it deciding again which compiled kernel the arguments select: binding them to the signature,
specializing each one, hashing the key, checking globals. A training step makes ~600 such launches,
and there the host, not the GPU, sets the pace (benchmarks/RESULTS.md). `CachedLaunchJITFunction` makes
that decision once per distinct *argument key* and then hands the arguments straight to the compiled
kernel's launcher, as `JITFunction.run` itself does after its lookup.

The key must separate every pair of calls that Triton could compile differently, so it is at least as
fine as Triton's specialization (`tests/ops/triton/test_launch.py` checks this against Triton's own
`native_specialize_impl`):
- a tensor: its dtype and whether its address is 16-byte aligned;
- an int: whether it is 1 (Triton makes it a constant), whether it is divisible by 16, and its integer
  type (i32, i64 or u64 by range); ints Triton is told not to specialize get the same finer key;
- a float, a bool, None: their type (None is a constant);
- a host tensor descriptor: dtype, block shape, padding and rank (its shape and strides are passed on
  every launch and re-encoded by the launcher);
- constexpr arguments and launch options (num_warps, num_stages): their values; and the device.
A call with any other kind of argument, a callable grid, or pre-run hooks takes Triton's own path. The
first call with a new key takes it too, so compilation, caching on disk and errors are Triton's. Two
checks Triton makes on every call are made on that first one only: that the globals a kernel reads have
not changed since it was compiled (ours read none), and the debug and instrumentation knobs (set them
before the first launch).

Which compiled kernel runs never changes what it computes, so bits are unaffected either way; the
kernels' tests run through this path on the GPU. Under the interpreter (`TRITON_INTERPRET=1`) kernels
are `InterpretedFunction`s and this class is not used.
"""

from __future__ import annotations

import inspect

from torch import Tensor

from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

I32 = (-(2**31), 2**31)
I64_MAX = 2**63


class Uncached(Exception):
    """An argument this cache does not know how to key: the call goes through Triton's own path."""


def arg_key(value) -> tuple | None:
    """What Triton's specialization can depend on for one non-constexpr argument (see the module doc)."""
    if isinstance(value, Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("u1",)
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, I32[0] <= value < I32[1], value < I64_MAX)
    if isinstance(value, float):
        return ("fp32",)
    if value is None:
        return None
    if isinstance(value, TensorDescriptor):
        return ("tensordesc", value.base.dtype, tuple(value.block_shape), value.padding, len(value.shape))
    raise Uncached(type(value).__name__)


class CachedLaunchJITFunction(JITFunction):
    """A `triton.jit` function whose launches after the first with a given argument key skip Triton's
    per-call specialization (module doc). Compiling, and calling it from other kernels, is unchanged."""

    def __init__(self, fn, **options):
        super().__init__(fn, **options)
        self.launches = {}  # argument key -> CompiledKernel
        self.tails = {}  # argument key -> the arguments after the positional ones, where they are all constexprs
        self._runtime = frozenset(p.name for p in self.params if not p.is_constexpr)
        self._defaults = {p.name: p.default for p in self.params if p.default is not inspect.Parameter.empty}

    def _key(self, device, args, kwargs) -> tuple:
        # The usual call passes runtime arguments by position and constexprs by name.
        if self._runtime.isdisjoint(kwargs):
            return device, tuple(map(arg_key, args)), tuple(kwargs.items())
        named = tuple((name, arg_key(value) if name in self._runtime else value) for name, value in kwargs.items())
        return device, tuple(map(arg_key, args)), named

    # For a kernel declared dependent (`triton_support.jit(dependent=True)`): device -> whether to launch it
    # with programmatic dependent launch, passed as its PDL constexpr and as Triton's launch_pdl option.
    dependent_launches = None

    def run(self, *args, grid, warmup, **kwargs):
        device = driver.active.get_current_device()
        if self.dependent_launches is not None:
            kwargs["PDL"] = kwargs["launch_pdl"] = self.dependent_launches(device)
        if warmup or self.pre_run_hooks or callable(grid):
            return super().run(*args, grid=grid, warmup=warmup, **kwargs)
        try:
            key = self._key(device, args, kwargs)
            kernel = self.launches.get(key)
        except (Uncached, TypeError):  # TypeError: an unhashable constexpr value
            return super().run(*args, grid=grid, warmup=warmup, **kwargs)
        if kernel is None:
            kernel = super().run(*args, grid=grid, warmup=warmup, **kwargs)
            if hasattr(kernel, "result"):
                kernel = kernel.result()
            if kernel is not None:
                self.launches[key] = kernel
                # Where every keyword is a constexpr, the key holds their values: the arguments after
                # the positional ones are the same on every launch with this key, so bind them once.
                if self._runtime.isdisjoint(kwargs):
                    self.tails[key] = self._tail(len(args), kwargs)
            return kernel
        tail = self.tails.get(key)
        bound = (*args, *(self._tail(len(args), kwargs) if tail is None else tail))
        stream = driver.active.get_current_stream(device)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        metadata = kernel.launch_metadata(grid, stream, *bound) if enter is not None else None
        kernel.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, kernel.function,
                   kernel.packed_metadata, metadata, enter, leave, *bound)
        return kernel

    def _tail(self, positional: int, kwargs: dict) -> tuple:
        """The values of the parameters after the first `positional`, from `kwargs` or their defaults."""
        return tuple(kwargs[name] if name in kwargs else self._defaults[name] for name in self.arg_names[positional:])
