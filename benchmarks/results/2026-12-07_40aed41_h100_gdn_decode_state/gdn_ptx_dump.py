import sys
sys.path.insert(0, "/work/main/benchmarks")
from sm90 import compile_kernel
from gdn_registers import HEADS, arg_type
from isoexec.ops.gdn import triton as fwd
out = sys.argv[1]
for name, bv, split, rows in (("s64", 64, True, False), ("u128", 128, False, False), ("s32", 32, True, False), ("u128r", 128, False, True)):
    c = {k: v for k, v in dict(HEADS, C=16, ROWS=rows, BV=bv, SPLIT=split).items() if k in fwd.gdn_fwd_kernel.arg_names}
    ptx = compile_kernel(fwd.gdn_fwd_kernel, c, arg_type, 4, 3, aligned=lambda n, t: t.startswith("*")).asm["ptx"]
    body = "\n".join(l for l in ptx.split(".section")[0].splitlines() if not l.startswith("//") and ".loc" not in l and ".file" not in l and not l.startswith("$L__tmp"))
    open(f"{out}_{name}.ptx", "w").write(body)
