"""What the Triton impls share: whether Triton is importable, whether its kernels run in the
interpreter, and a `jit` that keeps every kernel in the mode Triton itself was imported in.

Triton 3.6 reads `TRITON_INTERPRET` whenever `triton.jit` decorates a function, and `triton.language`
decorates its own helpers (`tl.zeros`, `tl.sum`, `tl.max`, `tl.cdiv`…) when it is first imported.
A kernel decorated in the other mode than those helpers fails at its first call ("Cannot call
@triton.jit'd outside of the scope of a kernel"), so the mode is fixed once, by the first
`import triton` in the process: set `TRITON_INTERPRET=1` before that, or not at all. `jit` below
decorates by that mode rather than by the variable's value when this module is imported.

The interpreter runs each program in numpy on the CPU. It stores bfloat16 as raw uint16 and does no
bfloat16 arithmetic (triton-lang/triton#11584: `tl.dot` multiplies the bit patterns), so kernels
convert bfloat16 tiles to float32 before any arithmetic, and before `tl.dot` when interpreting; its
float32 -> bfloat16 conversion truncates instead of rounding to nearest. Bits admitted under the
interpreter are therefore the interpreter's own, never the GPU's: admission records key on the device.

In the interpreter, `tl.dot` runs in a fixed order, the same bits on every CPU, and some of the
interpreter's pure overheads are gone: `triton_interpreter`, installed when this module is imported.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import os
import textwrap

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    from .triton_launch import CachedLaunchJITFunction
except ImportError as error:  # the Triton impls are then simply not registered
    # libtriton is a pybind11 module, which reports any exception raised while it initialises as an
    # ImportError ("initialization failed", the exception as its context): a Ctrl-C at that moment
    # would otherwise go unnoticed and leave Triton disabled.
    if isinstance(error.__context__, KeyboardInterrupt):
        raise KeyboardInterrupt from None
    triton = tl = None


def triton_available() -> bool:
    return triton is not None


def interpreting() -> bool:
    """Whether Triton kernels run in the interpreter: whether `triton` was imported with TRITON_INTERPRET=1."""
    return triton is not None and isinstance(tl.zeros, InterpretedFunction)


if interpreting():
    from . import triton_interpreter

    triton_interpreter.install()


def jit(fn=None, *, dependent: bool = False, **options):
    """`@jit` or `@jit(do_not_specialize=[...])`: a Triton kernel in the mode of `triton.language`.

    Compiled kernels are `triton_launch.CachedLaunchJITFunction`s, whose repeat launches skip Triton's
    per-call specialization, where the installed Triton is the one that class was written against (3.6);
    otherwise, and in the interpreter, Triton's own classes. Without Triton installed the function is
    returned undecorated; it is then never launched.

    `dependent=True`: a kernel that may start before the kernel ahead of it in the stream has finished
    (programmatic dependent launch, below). Its last parameter is `PDL: tl.constexpr = False` and its first
    statement `after_upstream(PDL)`, checked here, so nothing it reads or writes is touched before the
    kernel ahead is done."""
    if fn is None:
        return lambda f: jit(f, dependent=dependent, **options)
    if dependent:
        _check_dependent(fn)
    if triton is None:
        return fn
    if interpreting():
        return InterpretedFunction(fn, **options)
    if not triton.__version__.startswith("3.6."):
        return JITFunction(fn, **options)  # PDL stays False: launched as any kernel
    kernel = CachedLaunchJITFunction(fn, **options)
    if dependent:
        kernel.dependent_launches = dependent_launches
    return kernel


# Programmatic dependent launch (Hopper and later). Inside a CUDA graph, as in a stream, a kernel's
# programs start only once the kernel ahead has finished, and the launch itself, the programs' scheduling
# and their first instructions then sit on the critical path: ~1 us a kernel, over a decode step of a few
# hundred kernels. A kernel launched with `launch_pdl` may start while the kernel ahead still runs; it
# waits (griddepcontrol.wait) until that kernel has finished and its writes are visible, and it lets the
# kernel behind it start (griddepcontrol.launch_dependents) once it is past that wait, so at most two
# kernels overlap. Since every dependent kernel waits before touching memory, and a kernel finishes only
# after its own wait, a kernel never starts touching memory before every kernel ahead of it has finished:
# what each computes, and so every bit, is as without it. `ISOEXEC_PDL=0` turns it off (to measure it).
PDL_ENV = "ISOEXEC_PDL"


@functools.cache
def dependent_launches(device: int) -> bool:
    """Whether kernels declared `dependent` are launched with PDL on CUDA device `device`: sm_90 or later,
    compiled (not the interpreter), and not turned off by ISOEXEC_PDL=0."""
    if triton is None or interpreting() or os.environ.get(PDL_ENV, "1") == "0" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


if triton is not None:

    @jit
    def after_upstream(PDL: tl.constexpr):
        """A dependent kernel's first statement: with PDL, wait until the kernel ahead has finished and its
        writes are visible, then let the kernel behind start launching."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

else:
    after_upstream = None


def _check_dependent(fn) -> None:
    """A dependent kernel's contract (see `jit`): the last parameter PDL, a constexpr defaulting to False,
    and `after_upstream(PDL)` first, after the docstring."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    last = node.args.args[-1] if node.args.args else None
    if last is None or last.arg != "PDL" or not node.args.defaults or ast.unparse(node.args.defaults[-1]) != "False":
        raise TypeError(f"{fn.__name__}: a dependent kernel's last parameter is `PDL: tl.constexpr = False`")
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    if not body or ast.unparse(body[0]).strip() != "after_upstream(PDL)":
        raise TypeError(f"{fn.__name__}: a dependent kernel's first statement is `after_upstream(PDL)`")


# Host-side grid arithmetic. Triton's own `triton.cdiv` and `triton.next_power_of_2` are constexpr
# functions that also run inside kernels: called from Python they unwrap every argument and import on
# each call, ~4 us of host time apiece on an H200 host, three or more per launch.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 0 if n == 0 else 1 << (n - 1).bit_length()  # 0 for 0, as Triton's


# A row-wise kernel over a long row (a vocabulary) splits each row's chunks among programs when the call has
# few rows, so that a decode batch of one row is not one program walking the row alone: about this many
# programs a call. Kernels that do so fold their chunks' values in chunk order, so no split changes a bit.
SEGMENT_PROGRAMS = 512


def segments(rows: int, chunks: int) -> int:
    """How many programs share one row's `chunks`: 1 from SEGMENT_PROGRAMS rows up."""
    return max(1, min(chunks, SEGMENT_PROGRAMS // max(rows, 1)))


BOUNDARY_DTYPES = ("bfloat16", "float16", "float32")


def as_rows(t: Tensor) -> Tensor:
    """[..., N] as [R, N], a view where the layout allows (the kernels take strides); a 2-D t itself
    (a reshape is a few us of host time, and the trainer's packed rows are 2-D already)."""
    return t if t.dim() == 2 else t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def from_rows(t: Tensor, like: Tensor) -> Tensor:
    """The [R, N] rows t back in the shape of `like` [..., N] (as_rows' inverse)."""
    return t if like.dim() == 2 else t.reshape(like.shape)


# An elementwise kernel's element bits depend on its inputs only, never on the tile, so the tile is
# picked from the row width for speed alone: 1024 elements (a [1, 1024] slice of a wide row, or 16 rows
# of 64) over 4 warps give each thread 8 contiguous elements (16-byte bf16 loads).
ELEMENTWISE_TILE, ELEMENTWISE_WARPS = 1024, 4


def elementwise_tiles(rows: int, width: int) -> tuple[tuple[int, int], int, int]:
    """(grid, BLOCK_R, BLOCK_N) of an elementwise kernel over [rows, width] in ELEMENTWISE_TILE tiles."""
    block_n = min(ELEMENTWISE_TILE, next_power_of_2(width))
    block_r = ELEMENTWISE_TILE // block_n
    return (cdiv(rows, block_r), cdiv(width, block_n)), block_r, block_n


@jit
def elementwise_tile(num_rows, N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's [BLOCK_R, BLOCK_N] tile of a [num_rows, N] launch over `elementwise_tiles`' grid:
    row offsets (int64), column offsets, and the in-bounds mask."""
    o_r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return o_r, o_n, (o_r < num_rows)[:, None] & (o_n < N)[None, :]


@jit
def prefetch(pointers, L2: tl.constexpr, INTERPRETED: tl.constexpr):
    """Asks for the lines at `pointers` (a tensor of any shape; one pointer a 128-byte line is enough) to be brought
    into L1, or L2 where L2: a hint, which no value depends on (the interpreter, with no PTX, skips it). Every pointer
    must lie in memory the kernel may read."""
    if not INTERPRETED:
        if L2:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [pointers], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise("prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [pointers], dtype=tl.int32, is_pure=False, pack=1)


@jit
def settled(b_acc, INTERPRETED: tl.constexpr):
    """fp32 b_acc unchanged, as an opaque register copy: Triton rewrites `dot(a, b, 0) + c` into `dot(a, b,
    c)`, which starts the dot's accumulation from c (other arithmetic); a dot's result passed through this
    before anything is added to it keeps its own sum. The interpreter has no inline assembly and no such
    rewrite."""
    if INTERPRETED:
        return b_acc
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [b_acc], dtype=tl.float32, is_pure=True, pack=1)


# The two PTX instructions the attention kernels write out themselves (`rounded_mul`, `exp_ftz`; gluon_tile.py too).
_constexpr = tl.constexpr if tl is not None else (lambda value: value)  # kernels read module globals as constexprs only
MUL_RN_F32 = _constexpr("mul.rn.f32 $0, $1, $2;")
EX2_FTZ_F32 = _constexpr("ex2.approx.ftz.f32 $0, $1;")
LOG2E = _constexpr(1.4426950408889634)  # rounds to tl.exp's fp32 log2(e), 0x3FB8AA3B


@jit
def rounded_mul(a, b, INTERPRETED: tl.constexpr):
    """a * b in fp32, rounded on its own: with floating-point fusion on (Triton's default), a product followed by
    an add with nothing between them becomes one fused multiply-add (other bits), so whether it fuses would depend
    on whether a select happens to stand between. `mul.rn` is never fused. The interpreter fuses nothing."""
    if INTERPRETED:
        return a * b
    return tl.inline_asm_elementwise(MUL_RN_F32, "=r,r,r", [a, b], dtype=tl.float32, is_pure=True, pack=1)


@jit
def exp_ftz(x, INTERPRETED: tl.constexpr):
    """e^x as 2^(x * log2 e) by `ex2.approx.ftz.f32`: tl.exp's multiply and ex2 without the fix-up it adds for
    results below 2^-126 (three more instructions a value); such a result is +0 here. The interpreter takes
    numpy's exp."""
    if INTERPRETED:
        return tl.exp(x)
    return tl.inline_asm_elementwise(EX2_FTZ_F32, "=r,r", [x * LOG2E], dtype=tl.float32, is_pure=True, pack=1)


@jit
def load_fp32(p, o_r, o_n, m, stride_r, stride_n):
    """The [BLOCK_R, BLOCK_N] tile of p at rows o_r and columns o_n, widened to fp32 (masked lanes +0.0)."""
    return tl.load(p + o_r[:, None] * stride_r + o_n[None, :] * stride_n, mask=m, other=0.0).to(tl.float32)


def check_fp32_elementwise(impl_id: str, constants: dict) -> None:
    """The constants every fp32 elementwise kernel shares: compute_dtype float32, boundary dtypes it loads."""
    if constants["compute_dtype"] != "float32":
        raise ValueError(f'{impl_id} computes in float32 only, got compute_dtype = "{constants["compute_dtype"]}"')
    for name in ("input_dtype", "output_dtype"):
        if constants[name] not in BOUNDARY_DTYPES:
            raise ValueError(f"{impl_id}: {name} must be one of {', '.join(BOUNDARY_DTYPES)}, got \"{constants[name]}\"")


def needs_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd must record the op; without it the kernel is launched directly (the same
    kernel either way), which saves the autograd.Function overhead on every decode step."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def require_device(impl_id: str, *tensors: Tensor | None) -> None:
    """Refuse CPU tensors unless kernels run in the interpreter: a compiled Triton kernel needs a GPU."""
    if triton is None:
        raise RuntimeError(f"{impl_id} needs Triton, which is not installed")
    if not interpreting() and any(t is not None and t.is_cpu for t in tensors):
        raise RuntimeError(f"{impl_id} needs a CUDA device or TRITON_INTERPRET=1 (set before triton is first imported)")
