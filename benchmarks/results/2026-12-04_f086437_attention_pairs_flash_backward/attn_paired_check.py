"""attention.triton with paired key blocks (this branch) against main's (build/old/src: `git archive main src | tar -x -C build/old`),
same inputs: bits, and on a GPU decode time at batch 1 and 64. CPU: TRITON_INTERPRET=1 (small shapes)."""
import importlib, os, subprocess, sys, json, torch
here = os.path.dirname(os.path.abspath(__file__))
script = r'''
import sys, torch, json, os
from isoexec.ops.attention import paged_slot_table
from isoexec.ops.attention import triton as at
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
gpu = dev.type == "cuda"
out = {}
g = torch.Generator().manual_seed(0)
dtype = torch.bfloat16 if gpu else torch.float32
cases = ((16, 8, 128, 1, 192), (32, 8, 128, 1, 2048), (32, 8, 128, 64, 192), (32, 8, 128, 64, 2048)) if gpu else ((4, 2, 16, 1, 100), (4, 2, 16, 3, 70))
for heads, kvh, dim, batch, keys in cases:
    pages = torch.randperm(batch * keys // 16 + batch, generator=g)[: batch * (keys // 16 + 1)].reshape(batch, -1).to(dev)
    ks = torch.randn(pages.numel() * 16, kvh, dim, generator=g).to(dtype).to(dev)
    vs = torch.randn(pages.numel() * 16, kvh, dim, generator=g).to(dtype).to(dev)
    q = torch.randn(batch, heads, dim, generator=g).to(dtype).to(dev)
    seq = torch.arange(batch, device=dev); pos = torch.full((batch,), keys - 1, device=dev)
    table = paged_slot_table(pages, 16, keys + 16)
    op = at.bench_op() if gpu else at.bench_op(input_dtype="float32", output_dtype="float32", kv_cache_dtype="float32", block_m=16, num_stages=1)
    o = op(q, ks, vs, table, seq, pos, dim ** -0.5)
    t = None
    if gpu:
        sys.path.insert(0, "benchmarks"); from timing import graphed_ms
        t = graphed_ms(lambda: op(q, ks, vs, table, seq, pos, dim ** -0.5), dev) * 1e3
    out[f"{heads}/{kvh} d{dim} b{batch} k{keys}"] = (o.float().cpu().view(torch.int32).tolist() if not gpu else o.view(torch.int16).cpu().flatten().tolist(), t)
json.dump(out, open(sys.argv[1], "w"))
'''
res = {}
for label, path in (("main", "build/old/src"), ("paired", "src")):
    target = os.path.join(os.environ.get("OUT", "/tmp"), f"attn_{label}.json")
    subprocess.run([sys.executable, "-c", script, target], check=True, env={**os.environ, "PYTHONPATH": f"{path}:benchmarks"})
    res[label] = json.load(open(target))
for key in res["main"]:
    a, ta = res["main"][key]; b, tb = res["paired"][key]
    print(key, "bits", "equal" if a == b else "DIFFER", "" if ta is None else f"main {ta:.1f} us, paired {tb:.1f} us")
