"""What the Triton impls share: whether Triton is importable, whether kernels run in its interpreter,
and a `jit` that picks compiled or interpreted execution when a kernel is launched.

Triton 3.6's own `triton.jit` reads `TRITON_INTERPRET` once, when the decorator runs at import time,
and returns either a compiled `JITFunction` or an `InterpretedFunction`. A module imported before the
variable is set (by `import isoexec.ops`, say) would then be stuck with the compiled kernel even for
CPU tensors. `jit` below defers that choice to the launch, so the environment at the call decides.

The interpreter runs each program in numpy on the CPU. It stores bfloat16 as raw uint16 and does not
do bfloat16 arithmetic (triton-lang/triton#11584: `tl.dot` multiplies the bit patterns), so kernels
convert bfloat16 tiles to float32 before any arithmetic, and before `tl.dot` when interpreting; its
float32 -> bfloat16 conversion truncates instead of rounding to nearest. Bits admitted under the
interpreter are therefore the interpreter's own, never the GPU's: admission records key on the device.
"""

from __future__ import annotations

from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the Triton impls are then simply not registered
    triton = tl = None


def triton_available() -> bool:
    return triton is not None


def interpreting() -> bool:
    """Whether Triton kernels launched now run in the interpreter (`TRITON_INTERPRET=1`, read at each call)."""
    return triton is not None and bool(triton.knobs.runtime.interpret)


class Kernel:
    """A Triton kernel compiled or interpreted according to `TRITON_INTERPRET` at launch, not at import.

    `fn` is the plain Python function, kept so the registry can hash its source file."""

    def __init__(self, fn, options: dict):
        self.fn = fn
        self.options = options
        self._variants = {}

    def __getitem__(self, grid):
        interpret = interpreting()
        if interpret not in self._variants:
            # triton.jit consults the same switch, so it returns the variant wanted now.
            self._variants[interpret] = triton.jit(self.fn, **self.options)
        return self._variants[interpret][grid]


def jit(fn=None, **options):
    """`@jit` or `@jit(do_not_specialize=[...])`: `triton.jit` with the launch-time choice above."""
    if fn is None:
        return lambda f: Kernel(f, options)
    return Kernel(fn, options)


def require_device(impl_id: str, *tensors: Tensor) -> None:
    """Refuse CPU tensors unless the interpreter is on: a compiled Triton kernel only runs on a GPU."""
    if not triton_available():
        raise RuntimeError(f"{impl_id} needs Triton, which is not installed")
    if not interpreting() and any(t is not None and t.device.type == "cpu" for t in tensors):
        raise RuntimeError(f"{impl_id} needs a CUDA device or TRITON_INTERPRET=1")
