import subprocess, sys, os, re, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from isoexec.ops.attention import triton as at
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
k = at.attention_fwd_kernel
def build(step, rows, block_q, queries, warps, stages, maxnreg=None, block_n=32):
    cx = dict(G=4, G_PAD=4, D=128, HAS_WINDOW=False, DOT_IN_FP32=False, SUM_BY_DOT=False, BLOCK_Q=block_q, BLOCK_N=block_n,
              ROWS=rows, QUERIES=queries, STEP=step, WITH_LSE=False, PDL=False)
    ptr = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "lse": "*fp32", "slot_table": "*i64", "seq_ids": "*i64", "positions": "*i64"}
    types = {n: "constexpr" if n in cx else ptr.get(n, "fp32" if n == "scale" else "i32") for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if n in ptr or n.startswith("stride_")}
    opts = {"num_warps": warps, "num_stages": stages}
    if maxnreg: opts["maxnreg"] = maxnreg
    c = triton.compile(ASTSource(k, types, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(c.asm["ptx"])
    out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"] + ([f"--maxrregcount={maxnreg}"] if maxnreg else []), capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", out)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return regs, spill, c.metadata.shared, c.metadata.num_warps if hasattr(c.metadata,'num_warps') else None
for label, args in [("decode x2 w4 s3", (2, 64, 16, 1, 4, 3)), ("decode x1 w4 s3", (1, 64, 16, 1, 4, 3)),
                    ("decode x2 w4 s3 maxnreg128", (2, 64, 16, 1, 4, 3, 128)), ("decode x2 w4 s3 maxnreg168", (2, 64, 16, 1, 4, 3, 168)),
                    ("prefill r128 x2 w8 s3", (2, 128, 32, 32, 8, 3)), ("prefill r128 x1 w8 s3", (1, 128, 32, 32, 8, 3))]:
    print(label, build(*args), flush=True)
