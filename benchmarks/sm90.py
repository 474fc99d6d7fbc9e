"""A Triton or Gluon kernel compiled for Hopper (sm_90a) on any machine, no GPU needed, and its registers and spills as
ptxas reports them: what gdn_registers.py, attention_gluon.py --compile-only and pdl_ptx.py build on."""

import inspect
import os
import pathlib
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

PTXAS = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
TARGET = GPUTarget("cuda", 90, 32)


def compile_kernel(kernel, constants: dict, arg_type, num_warps: int, num_stages: int | None = None, aligned=lambda name, type_: False,
                   gluon: bool = False):
    """kernel compiled for sm_90a. `constants`: its constexpr parameters by name; `arg_type(name)`: every other
    parameter's Triton type ("*bf16", "i32", "fp32", ...); `aligned(name, type)`: whether a launch passes it divisible
    by 16 (a pointer's address, a stride), as Triton's specialization would mark it."""
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(inspect.signature(kernel.fn).parameters):
        if name in constants:
            signature[name], constexprs[(i,)] = "constexpr", constants[name]
            continue
        signature[name] = arg_type(name)
        if aligned(name, signature[name]):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as source
    options = {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})
    return triton.compile(source(kernel, signature, constexprs=constexprs, attrs=attrs), target=TARGET, options=options)


def ptxas(ptx: str, folder: pathlib.Path | None = None, name: str = "kernel") -> tuple[int, int]:
    """(registers, bytes of spill stores) of `ptx` assembled for sm_90a; the PTX is kept in `folder` if given."""
    with tempfile.TemporaryDirectory() as scratch:
        path = pathlib.Path(folder or scratch) / f"{name}.ptx"
        path.write_text(ptx)
        report = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", str(path), "-o", os.devnull], capture_output=True, text=True,
                                check=True).stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return int(registers.group(1)) if registers else -1, int(spills.group(1)) if spills else 0
