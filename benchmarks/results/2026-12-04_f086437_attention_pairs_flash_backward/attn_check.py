"""attention.triton of two trees (build/old/src: the commit before; src: with key blocks walked in pairs) on the
same inputs: bits of every output element (sha-256 of the bf16 outputs as int16), and graph-replay time; prefill/training forms packed,
decode forms paged. Run from the repository root: PYTHONPATH=src:benchmarks python3 <this> (a GPU)."""
import json, os, subprocess, sys

SCRIPT = r'''
import hashlib, json, sys, torch
from isoexec.ops.attention import paged_slot_table, packed_slot_table
from isoexec.ops.attention import triton as at
from timing import graphed_ms
dev, dim, out = torch.device("cuda"), 128, {}
g = torch.Generator().manual_seed(0)
digest = lambda o: hashlib.sha256(o.view(torch.int16).cpu().numpy().tobytes()).hexdigest()
rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).to(dev)
op = at.bench_op()
for heads, kvh, num_seqs, length in ((32, 8, 1, 2048), (32, 8, 1, 8192), (16, 8, 8, 2048), (16, 8, 32, 512), (32, 8, 4, 300)):
    table, seq_ids, positions = packed_slot_table(torch.arange(num_seqs + 1, device=dev) * length)
    q, k, v = rnd(num_seqs * length, heads, dim), rnd(num_seqs * length, kvh, dim), rnd(num_seqs * length, kvh, dim)
    args = (q, k, v, table, seq_ids, positions, dim ** -0.5)
    o = op(*args)
    out[f"prefill {num_seqs}x{length} {heads}/{kvh}"] = (digest(o), graphed_ms(lambda: op(*args), dev) * 1e3)
for heads, kvh, batch, keys in ((32, 8, 1, 2048), (32, 8, 64, 2048), (32, 8, 64, 8192), (16, 8, 64, 2048), (32, 8, 64, 517), (32, 8, 1, 193)):
    blocks = -(-keys // 16)
    pages = torch.randperm(batch * blocks, generator=g).reshape(batch, blocks).to(dev)
    ks, vs = rnd(batch * blocks * 16, kvh, dim), rnd(batch * blocks * 16, kvh, dim)
    q = rnd(batch, heads, dim)
    seq, pos = torch.arange(batch, device=dev), torch.full((batch,), keys - 1, device=dev)
    args = (q, ks, vs, paged_slot_table(pages, 16, blocks * 16), seq, pos, dim ** -0.5)
    o = op(*args)
    out[f"decode b{batch} k{keys} {heads}/{kvh}"] = (digest(o), graphed_ms(lambda: op(*args), dev) * 1e3)
json.dump(out, open(sys.argv[1], "w"))
'''
res = {}
for label, path in (("before", "build/old/src"), ("pairs", "src")):
    target = os.path.join(os.environ.get("OUT", "/tmp"), f"attn_{label}.json")
    subprocess.run([sys.executable, "-c", SCRIPT, target], check=True, env={**os.environ, "PYTHONPATH": f"{path}:benchmarks"})
    res[label] = json.load(open(target))
    os.remove(target)
for key, (bits, t) in res["before"].items():
    bits2, t2 = res["pairs"][key]
    print(f"{key:<28} bits {'equal' if bits == bits2 else 'DIFFER'}  before {t:8.1f} us  pairs {t2:8.1f} us  ({t / t2:.2f}x)")
