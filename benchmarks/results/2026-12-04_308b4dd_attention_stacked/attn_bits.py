"""The preset's attention launch (bench_op) on this tree against another tree's: sha-256 of the bf16 output per
case, and graph-replay time, flash SDPA beside. REF=write stores this tree's digests and times in $OUT/ref.json;
otherwise they are compared with that file. Run: PYTHONPATH=<tree>/src:benchmarks python3 attn_bits.py"""
import hashlib, json, os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from isoexec.ops.attention import packed_slot_table, paged_slot_table
from isoexec.ops.attention import triton as at
from timing import graphed_ms, kernel_ms

dev, dim = torch.device("cuda"), 128
g = torch.Generator().manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).to(dev)  # noqa: E731
digest = lambda o: hashlib.sha256(o.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]  # noqa: E731
write = os.environ.get("REF") == "write"
ref_file = os.path.join(os.environ.get("OUT", "."), "ref.json")
refs = {} if write else json.load(open(ref_file))
written = {}
op = at.bench_op()


def report(case, args, flash):
    out = op(*args)
    torch.cuda.synchronize()
    d = digest(out)
    t = graphed_ms(lambda: op(*args), dev)
    tk = kernel_ms(lambda: op(*args), dev)
    written[case] = dict(digest=d, us=t * 1e3, eager_us=tk * 1e3)
    ref = refs.get(case)
    verdict = "" if write else ("bits as ref" if ref and ref["digest"] == d else "bits DIFFER from ref") + f" (ref {ref['us']:.1f} us, eager {ref['eager_us']:.1f} us)"
    print(f"{case}: flash {flash * 1e3:.1f} us, preset {t * 1e3:.1f} us ({flash / t:.2f} of flash), eager {tk * 1e3:.1f} us {verdict}", flush=True)


for heads, kvh, num_seqs, length in ((32, 8, 1, 512), (32, 8, 1, 2048), (32, 8, 1, 8192), (32, 8, 8, 2048), (16, 8, 1, 2048),
                                      (16, 8, 32, 512), (32, 8, 4, 300), (32, 8, 3, 77)):
    table, seq_ids, positions = packed_slot_table(torch.arange(num_seqs + 1, device=dev) * length)
    q, k, v = rnd(num_seqs * length, heads, dim), rnd(num_seqs * length, kvh, dim), rnd(num_seqs * length, kvh, dim)
    dense = [t.view(num_seqs, length, -1, dim).transpose(1, 2) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = graphed_ms(lambda: F.scaled_dot_product_attention(*dense, is_causal=True, enable_gqa=True), dev)
    report(f"prefill {num_seqs}x{length} {heads}/{kvh}", (q, k, v, table, seq_ids, positions, dim ** -0.5), flash)
# a chunk of a prefill after cached keys (queries at positions 1000..1199 of one sequence)
table, _, _ = packed_slot_table(torch.tensor([0, 1200], device=dev))
kc, vc, qc = rnd(1200, 8, dim), rnd(1200, 8, dim), rnd(200, 32, dim)
report("prefill chunk 200 after 1000 32/8", (qc, kc, vc, table, torch.zeros(200, dtype=torch.long, device=dev),
                                              torch.arange(1000, 1200, device=dev), dim ** -0.5), float("nan"))
for heads, kvh, batch, keys in ((32, 8, 1, 2048), (32, 8, 64, 512), (32, 8, 64, 2048), (32, 8, 64, 8192), (16, 8, 64, 2048)):
    blocks = -(-keys // 16)
    pages = torch.randperm(batch * blocks, generator=g).reshape(batch, blocks).to(dev)
    ks, vs = rnd(batch * blocks * 16, kvh, dim), rnd(batch * blocks * 16, kvh, dim)
    q = rnd(batch, heads, dim)
    seq, pos = torch.arange(batch, device=dev), torch.full((batch,), keys - 1, device=dev)
    table = paged_slot_table(pages, 16, blocks * 16)
    idx = torch.stack([(pages[b].repeat_interleave(16) * 16 + torch.arange(16, device=dev).repeat(blocks))[:keys] for b in range(batch)])
    kd, vd = ks[idx].transpose(1, 2), vs[idx].transpose(1, 2)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = graphed_ms(lambda: F.scaled_dot_product_attention(q[:, :, None, :], kd, vd, enable_gqa=True), dev)
    report(f"decode b{batch} k{keys} {heads}/{kvh}", (q, ks, vs, table, seq, pos, dim ** -0.5), flash)
if write:
    json.dump(written, open(ref_file, "w"), indent=1)
