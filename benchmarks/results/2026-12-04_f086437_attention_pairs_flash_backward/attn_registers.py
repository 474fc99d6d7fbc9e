"""attention_fwd_kernel compiled for sm_90 on a CPU (no GPU needed): registers, spill bytes (stores, loads) and
shared memory per form, Qwen3-8B heads, bf16, pointers and strides marked 16-divisible as a launch specialises
them. Run: env -u TRITON_INTERPRET PYTHONPATH=src python3 attn_registers.py (Triton's bundled ptxas)."""
import subprocess, sys, os, re, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from isoexec.ops.attention import triton as at
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
k = at.attention_fwd_kernel
def build(paired, rows, block_q, queries, warps, stages, block_n=32):
    cx = dict(G=4, G_PAD=4, D=128, HAS_WINDOW=False, DOT_IN_FP32=False, SUM_BY_DOT=False, BLOCK_Q=block_q, BLOCK_N=block_n,
              ROWS=rows, QUERIES=queries, PAIRED=paired, WITH_LSE=False, PDL=False)
    ptr = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "lse": "*fp32", "slot_table": "*i64", "seq_ids": "*i64", "positions": "*i64"}
    types = {n: "constexpr" if n in cx else ptr.get(n, "fp32" if n == "scale" else "i32") for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if n in ptr or n.startswith("stride_")}
    c = triton.compile(ASTSource(k, types, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(c.asm["ptx"])
    out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", out)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return regs, spill, c.metadata.shared
for label, args in [("prefill single w4", (False, 64, 16, 16, 4, 3)), ("prefill paired w4", (True, 64, 16, 16, 4, 3)),
                    ("prefill paired w8", (True, 64, 16, 16, 8, 3)), ("prefill single w8", (False, 64, 16, 16, 8, 3)),
                    ("prefill paired w4 s2", (True, 64, 16, 16, 4, 2)),
                    ("decode single w4", (False, 16, 1, 1, 4, 3)), ("decode paired w4", (True, 16, 1, 1, 4, 3))]:
    print(label, build(*args), flush=True)
