"""EXPERIMENT: attention_fwd_kernel launched directly over tile rows, warps, stages and key blocks per step,
prefill (packed, one or more sequences) and decode (paged), against the preset's launch: sha-256 of the bf16
output (bits) and graph-replay time, flash SDPA beside. Run: PYTHONPATH=src:benchmarks python3 benchmarks/attn_sweep.py"""
import hashlib, json, os, sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from isoexec.ops.attention import packed_slot_table, paged_slot_table
from isoexec.ops.attention import triton as at
from timing import graphed_ms

dev, dim = torch.device("cuda"), 128
g = torch.Generator().manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).to(dev)  # noqa: E731
digest = lambda o: hashlib.sha256(o.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]  # noqa: E731


def launch(q, ks, vs, table, seq, pos, rows, warps, stages, step, queries):
    T, H, D = q.shape
    hkv = ks.shape[1]
    G = H // hkv
    block_q = rows // G
    queries = 1 if queries == 1 else block_q
    o = torch.empty_like(q)
    def fn():
        at.attention_fwd_kernel[(triton_cdiv(T, queries), hkv)](
            q, ks, vs, o, o, table, seq, pos, T, table.shape[1], ks.shape[0], D ** -0.5, 0,
            q.stride(0), q.stride(1), ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1), o.stride(0), o.stride(1),
            table.stride(0), 0, G=G, G_PAD=G, D=D, HAS_WINDOW=False, DOT_IN_FP32=False, SUM_BY_DOT=False,
            BLOCK_Q=block_q, BLOCK_N=32, ROWS=rows, QUERIES=queries, STEP=step, WITH_LSE=False,
            num_warps=warps, num_stages=stages)
    return fn, o


def triton_cdiv(a, b):
    return -(-a // b)


PREFILL = [(64, 4, 3, 1), (64, 4, 3, 2), (64, 4, 4, 1), (128, 8, 3, 1), (128, 8, 3, 2), (128, 8, 4, 2), (128, 8, 4, 1)]
DECODE = [(64, 4, 3, 2), (64, 4, 3, 1), (64, 4, 4, 2), (64, 4, 3, 4)]
# REF=write: only the preset's launch (bench_op) on this tree, digests and times to $OUT/ref.json (run on the
# tree to compare against); otherwise every config, bits compared with that file's digests where it exists.
MODE = os.environ.get("REF", "")
REF_FILE = os.path.join(os.environ.get("OUT", "."), "ref.json")
refs = json.load(open(REF_FILE)) if MODE != "write" and os.path.exists(REF_FILE) else {}
written = {}
if MODE == "write":
    PREFILL, DECODE = [], []
results = []
for heads, kvh, num_seqs, length in ((32, 8, 1, 512), (32, 8, 1, 2048), (32, 8, 1, 8192), (32, 8, 8, 2048)):
    table, seq_ids, positions = packed_slot_table(torch.arange(num_seqs + 1, device=dev) * length)
    q, k, v = rnd(num_seqs * length, heads, dim), rnd(num_seqs * length, kvh, dim), rnd(num_seqs * length, kvh, dim)
    dense = [t.view(num_seqs, length, -1, dim).transpose(1, 2) for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = graphed_ms(lambda: F.scaled_dot_product_attention(*dense, is_causal=True, enable_gqa=True), dev)
    case = f"prefill {num_seqs}x{length}"
    op = at.bench_op()
    ref = digest(op(q, k, v, table, seq_ids, positions, dim ** -0.5))
    preset = graphed_ms(lambda: op(q, k, v, table, seq_ids, positions, dim ** -0.5), dev)
    written[case] = dict(digest=ref, us=preset * 1e3)
    line = [f"{case}: flash {flash * 1e3:.1f} us, preset {preset * 1e3:.1f} us ({flash / preset:.2f}), "
            f"{'bits as ref' if refs.get(case, {}).get('digest') == ref else 'bits DIFFER from ref' if case in refs else 'no ref'}"
            + (f" (ref {refs[case]['us']:.1f} us)" if case in refs else "")]
    for rows, warps, stages, step in PREFILL:
        try:
            fn, o = launch(q, k, v, table, seq_ids, positions, rows, warps, stages, step, queries=0)
            fn(); torch.cuda.synchronize()
            bits = "same" if digest(o) == ref else "DIFFER"
            t = graphed_ms(fn, dev)
            results.append(dict(form="prefill", seqs=num_seqs, len=length, rows=rows, warps=warps, stages=stages, step=step, us=t * 1e3, of_flash=flash / t, bits=bits))
            line.append(f"r{rows} w{warps} s{stages} x{step}: {t * 1e3:.1f} us {flash / t:.2f} {bits}")
        except Exception as e:  # noqa: BLE001
            line.append(f"r{rows} w{warps} s{stages} x{step}: {type(e).__name__} {str(e)[:80]}")
    print("\n  ".join(line), flush=True)
for heads, kvh, batch, keys in ((32, 8, 1, 2048), (32, 8, 64, 512), (32, 8, 64, 2048), (32, 8, 64, 8192)):
    blocks = -(-keys // 16)
    pages = torch.randperm(batch * blocks, generator=g).reshape(batch, blocks).to(dev)
    ks, vs = rnd(batch * blocks * 16, kvh, dim), rnd(batch * blocks * 16, kvh, dim)
    q = rnd(batch, heads, dim)
    seq, pos = torch.arange(batch, device=dev), torch.full((batch,), keys - 1, device=dev)
    table = paged_slot_table(pages, 16, blocks * 16)
    kd = torch.stack([ks[(pages[b].repeat_interleave(16) * 16 + torch.arange(16, device=dev).repeat(blocks))[:keys]] for b in range(batch)]).transpose(1, 2)
    vd = torch.stack([vs[(pages[b].repeat_interleave(16) * 16 + torch.arange(16, device=dev).repeat(blocks))[:keys]] for b in range(batch)]).transpose(1, 2)
    qd = q[:, :, None, :]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = graphed_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True), dev)
    case = f"decode b{batch} k{keys}"
    op = at.bench_op()
    ref = digest(op(q, ks, vs, table, seq, pos, dim ** -0.5))
    preset = graphed_ms(lambda: op(q, ks, vs, table, seq, pos, dim ** -0.5), dev)
    written[case] = dict(digest=ref, us=preset * 1e3)
    line = [f"{case}: flash {flash * 1e3:.1f} us, preset {preset * 1e3:.1f} us ({flash / preset:.2f}), "
            f"{'bits as ref' if refs.get(case, {}).get('digest') == ref else 'bits DIFFER from ref' if case in refs else 'no ref'}"
            + (f" (ref {refs[case]['us']:.1f} us)" if case in refs else "")]
    for rows, warps, stages, step in DECODE:
        try:
            fn, o = launch(q, ks, vs, table, seq, pos, rows, warps, stages, step, queries=1)
            fn(); torch.cuda.synchronize()
            bits = "same" if digest(o) == ref else "DIFFER"
            t = graphed_ms(fn, dev)
            results.append(dict(form="decode", batch=batch, keys=keys, rows=rows, warps=warps, stages=stages, step=step, us=t * 1e3, of_flash=flash / t, bits=bits))
            line.append(f"r{rows} w{warps} s{stages} x{step}: {t * 1e3:.1f} us {flash / t:.2f} {bits}")
        except Exception as e:  # noqa: BLE001
            line.append(f"r{rows} w{warps} s{stages} x{step}: {type(e).__name__} {str(e)[:80]}")
    print("\n  ".join(line), flush=True)
if MODE == "write":
    json.dump(written, open(REF_FILE, "w"), indent=1)
elif os.environ.get("OUT"):
    json.dump(results, open(os.path.join(os.environ["OUT"], "attn_sweep.json"), "w"), indent=1)
