import re, collections, sys, subprocess, os, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from isoexec.ops.attention import triton as at
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
k = at.attention_fwd_kernel
def build(one, rows, block_q, queries, warps, stages):
    cx = dict(G=4, G_PAD=4, D=128, HAS_WINDOW=False, DOT_IN_FP32=False, SUM_BY_DOT=False, BLOCK_Q=block_q, BLOCK_N=32,
              ROWS=rows, QUERIES=queries, PAIRED=True, WITH_LSE=False, PDL=False, ONE_DOT=one)
    ptr = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "lse": "*fp32", "slot_table": "*i64", "seq_ids": "*i64", "positions": "*i64"}
    types = {n: "constexpr" if n in cx else ptr.get(n, "fp32" if n == "scale" else "i32") for n in k.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if n in ptr or n.startswith("stride_")}
    return triton.compile(ASTSource(k, types, constexprs=cx, attrs=attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
for one in (False, True):
    for cfg in ((128, 32, 32, 8, 3), (64, 16, 1, 4, 3)):
        c = build(one, *cfg)
        ptx = c.asm["ptx"]; ttgir = c.asm["ttgir"]
        open(f"build/onedot_{one}_{cfg[0]}.ttgir", "w").write(ttgir)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f: f.write(ptx)
        out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True).stderr
        print(one, cfg, re.findall(r"Used (\d+) registers", out), re.findall(r"(\d+) bytes spill stores", out), c.metadata.shared,
              "convert_layout", ttgir.count("convert_layout"), "local_alloc", ttgir.count("local_alloc"),
              "wgmma waits", ptx.count("wgmma.wait_group"), "n64", ptx.count("m64n64k16"), "n32", ptx.count("m64n32k16"), flush=True)
