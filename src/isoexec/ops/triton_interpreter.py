"""Triton's interpreter as IsoExec runs it on a CPU: `tl.dot` in a fixed order, and the interpreter's pure
overheads removed. `install()` is called by `triton_support` when kernels are interpreted.

The interpreter computes `tl.dot` with `np.matmul`, that is with numpy's BLAS, which picks its kernels
by CPU model (OpenBLAS DYNAMIC_ARCH): with the Haswell/Zen kernels a row's products are summed in
another order depending on which row of the tile it occupies, so a kernel invariant on every GPU
looked batch-dependent on AMD AVX2 machines and invariant on AVX-512 ones. In the interpreter, `tl.dot`
is therefore `fixed_order_dot`: each element's products, in the accumulator's dtype, summed in
ascending k by elementwise IEEE adds (numpy never contracts separate ufuncs into an FMA), then added to
the accumulator as the interpreter's own dot does. Each output element is then a function of its own
row and column alone, as an MMA's is, with the same bits on every CPU.

The interpreter runs every op of every program through Triton's front end (`triton.language`'s type
checks and the semantic layer) and then numpy. On small tiles the front end is most of the time, and
part of it computes nothing the kernel uses: `_install_faster_patching` and `_install_lighter_front_end`
remove that part (Triton 3.6 only; another Triton keeps its own), leaving every value a kernel computes
as it was. `_install_scalar_index` lets a loop run to a loaded bound, as compiled kernels do.
"""

from __future__ import annotations

import builtins
import inspect

import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter


def install() -> None:
    _install_fixed_order_dot()
    if triton.__version__.startswith("3.6."):
        _install_faster_patching()
        _install_lighter_front_end()
        _install_scalar_index()


def fixed_order_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc + a [..., M, K] @ b [..., K, N] for floating operands, in a fixed order (module doc)."""
    a, b = a.astype(acc.dtype), b.astype(acc.dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # the battery's hazard rows overflow on purpose
        total = a[..., :, 0, None] * b[..., None, 0, :]
        for k in range(1, a.shape[-1]):
            total = total + a[..., :, k, None] * b[..., None, k, :]
        return total + acc


def _install_fixed_order_dot() -> None:
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "fixed_order", False):
        return
    blas_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        # Integer dots (exact sums) and operands the interpreter stores as raw bits (bf16, fp8) keep its own.
        if not all(np.issubdtype(t.data.dtype, np.floating) for t in (a, b, d)):
            return blas_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        return interpreter.TensorHandle(fixed_order_dot(a.data, b.data, d.data), d.dtype.scalar)

    create_dot.fixed_order = True
    builder.create_dot = create_dot


def _install_faster_patching() -> None:
    """Triton 3.6 patches `triton.language`'s builtins (kernel, tensor and math functions) to its numpy
    builder at every launch and again at every call of a nested `@jit` function (our helpers, and its own
    `tl.sum`, `tl.zeros`…), each time finding them by `inspect.getmembers` over the whole module: a few
    milliseconds a call, about a third of an interpreted kernel's time where helpers are called per tile. A
    nested call finds every builtin of the modules it sees patched already (by the launch, or for good by
    an earlier nested call: Triton never restores those), so it patches nothing: here it returns at once
    when that is so, and otherwise patches as Triton does, by the names of the module's builtins, listed
    once.

    It also builds its table from Triton to numpy dtypes anew at every tensor it makes; here the table is
    built once, from Triton's own function."""
    needed = ("_patch_lang", "_patch_builtin", "_patch_attr", "_LangPatchScope", "_get_np_dtype")
    if not all(hasattr(interpreter, name) for name in needed) or getattr(interpreter._patch_lang, "faster", False):
        return
    patch_lang, np_dtype = interpreter._patch_lang, interpreter._get_np_dtype
    builtin_names: dict[int, list[str]] = {}
    langs_of: dict[object, list] = {}

    def _patch_builtin(pkg, builder, scope):
        if id(pkg) not in builtin_names:  # the first call comes before any patch: every builtin in place
            builtin_names[id(pkg)] = [name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
        for name in builtin_names[id(pkg)]:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    def _patched(lang) -> bool:
        """Whether a patch of `lang` would find nothing to patch: its own builtins (patched together, and
        with its `range`, reductions…) and those of the classes a patch of it also covers, which the launch's
        scope restores apart from a nested call's leftovers."""
        probes = [lang.program_id, lang.tensor.__add__, tl.core.tensor_descriptor_base.load] + ([tl.math.exp] if lang is tl else [])
        return not any(tl.core.is_builtin(probe) for probe in probes)

    def _patch_lang(fn):
        if fn not in langs_of:
            langs_of[fn] = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        if langs_of[fn] and all(_patched(lang) for lang in langs_of[fn]):
            return interpreter._LangPatchScope()
        return patch_lang(fn)

    scalar_dtypes = [value for value in vars(tl).values() if isinstance(value, tl.dtype) and not isinstance(value, tl.pointer_type)]
    numpy_of = {dtype: np_dtype(dtype) for dtype in scalar_dtypes if _has_np_dtype(np_dtype, dtype)}

    def _get_np_dtype(tt_dtype):
        element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        found = numpy_of.get(element) if not isinstance(element, tl.pointer_type) else None
        return found if found is not None else np_dtype(tt_dtype)

    _patch_lang.faster = True
    interpreter._patch_builtin, interpreter._patch_lang, interpreter._get_np_dtype = _patch_builtin, _patch_lang, _get_np_dtype


def _install_scalar_index() -> None:
    """Triton 3.6's interpreter holds a scalar (a loaded value, a program id) as a one-element array and takes
    `int()` of it as the scalar's index, which numpy 2.4 refuses for arrays of one dimension: a `for` over
    `range(n)` or `tl.range(n)` with a loaded n fails ("only 0-dimensional arrays can be converted"), where a
    compiled kernel loops. Here the index is the array's one element; anything larger is refused as before."""
    if not hasattr(interpreter, "_patch_lang_tensor") or getattr(interpreter._patch_lang_tensor, "scalar_index", False):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item() if self.handle.data.size == 1 else self.handle.data))

    _patch_lang_tensor.scalar_index = True
    interpreter._patch_lang_tensor = _patch_lang_tensor


def _has_np_dtype(np_dtype, dtype) -> bool:
    try:
        np_dtype(dtype)
        return True
    except KeyError:
        return False


def _install_lighter_front_end() -> None:
    """Three costs of Triton 3.6's front end that no value depends on, together about half of an interpreted
    kernel's time on small tiles:

    - `add`, `sub` and `mul` of integer tensors (every offset and mask) first compute the result again in
      int64 and compare it with the type's bounds, for a `device_assert` that does nothing unless the
      kernel is compiled with `debug`. In the interpreter without `debug` that check is skipped.
    - A `tl.tuple` (every tensor's shape is one) builds its `tuple_type` when made, and the type its name
      string, formatting every element. Both are now made when first read; they are rarely read.
    - A `block_type` (every tensor's type) unwraps and validates its shape and formats its name when made.
      A shape already validated once is taken as it is, and the name is formatted when read.

    None changes a value, only when (or whether) a type or a dead check is computed. The type changes also
    apply to kernels compiled in the same process; the overflow check is skipped in the interpreter only."""
    from triton.language.semantic import TritonSemantic as semantic

    core = tl.core
    if getattr(core.block_type.__init__, "lighter", False):
        return

    check_overflow = semantic.binary_op_sanitize_overflow_impl

    def binary_op_sanitize_overflow_impl(self, lhs, rhs, binary_op):
        if self.builder.options.debug or not isinstance(self.builder, interpreter.InterpreterBuilder):
            return check_overflow(self, lhs, rhs, binary_op)

    def tuple_type_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [""] * len(types)

    def tuple_type_name(self):
        return "[" + ",".join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + "]"

    def tuple_init(self, args, type=None):
        self.values = list(args)
        self._type = type if type is None or isinstance(type, core.tuple_type) else core.tuple_type(type)

    def tuple_type_of(self):
        if self._type is None:
            self._type = core._type_for_tuple_values(self.values)
        return self._type

    def set_tuple_type(self, type):
        self._type = type

    block_type_init = core.block_type.__init__
    numel_of: dict[builtins.tuple, int] = {}  # shapes Triton's own check has passed

    def lighter_block_type_init(self, element_ty, shape):
        dims = []
        for d in shape.values if isinstance(shape, core.tuple) else shape if isinstance(shape, list) else ():
            d = d.value if type(d) is core.constexpr else d
            if type(d) is not int:
                break
            dims.append(d)
        else:
            numel = numel_of.get(builtins.tuple(dims))
            if numel is not None:
                self.element_ty, self.shape, self.numel = element_ty, core.tuple(dims), numel
                return
        block_type_init(self, element_ty, shape)  # its checks and errors; the name it sets goes to the property below
        numel_of[builtins.tuple(self.shape)] = self.numel

    def block_type_name(self):
        return f"<{self.shape}, {self.element_ty}>"

    lighter_block_type_init.lighter = True
    semantic.binary_op_sanitize_overflow_impl = binary_op_sanitize_overflow_impl
    core.tuple_type.__init__, core.tuple_type.name = tuple_type_init, property(tuple_type_name)
    core.tuple.__init__, core.tuple.type = tuple_init, property(tuple_type_of, set_tuple_type)
    core.block_type.__init__ = lighter_block_type_init
    core.block_type.name = property(block_type_name, lambda self, name: None)
