"""attention.triton's online-softmax key block (`block_n`, the fold: it decides the bits, so a change is a new contract
constant for every case alike) at 32, 64 and 128 keys, with the tile rows / warps / stages beside it (issue 22: prefill
at 0.60-0.64 of flash SDPA with 32-key folds, where flash walks 128-key blocks). Per config: decode rows against the
trainer's rows at Qwen3-8B's head shape (bf16 and fp32: zero differing elements under any one config, as the Triton
interpreter shows for 32, 64 and 128 at head_dim 16), then prefill (one sequence of 512, 2048, 8192) and decode (64
sequences at 512, 2048, 8192 keys; one at 2048) time against flash SDPA (bench.py attention's forms).

    cd benchmarks && OUT=dir [CONFIGS=n] PYTHONPATH=../src python3 attention_fold.py   # the first n configs; attention_fold.json in dir
"""
import json
import os

import torch

from attention import decode, prefill
from isoexec.ops.attention import packed_slot_table
from isoexec.ops.attention import triton as at

dev = torch.device("cuda")
HEADS = (32, 8, 128)
CONFIGS = [(32, 64, 4, 3), (64, 64, 4, 3), (128, 64, 4, 2), (64, 128, 8, 3), (64, 64, 4, 2), (128, 128, 8, 2), (128, 64, 4, 3)]
CONFIGS = CONFIGS[: int(os.environ.get("CONFIGS", len(CONFIGS)))]


def consistent(op, dtype) -> int:
    """Elements where decode rows differ from the trainer's rows (two sequences, four decode steps)."""
    lengths, steps = (300, 133), ((299, 132), (200, 64), (63, 0), (64, 127))
    cu = torch.tensor([0, lengths[0], sum(lengths)], device=dev)
    table, seq_ids, positions = packed_slot_table(cu)
    g = torch.Generator(dev).manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), h, 128, generator=g, device=dev).to(dtype) for h in (8, 2, 2))
    trained = op(q, k, v, table, seq_ids, positions, 128**-0.5)
    bad = 0
    for step in steps:
        rows = torch.tensor([0, lengths[0]], device=dev) + torch.tensor(step, device=dev)
        got = op(q[rows], k, v, table, torch.arange(2, device=dev), torch.tensor(step, device=dev), 128**-0.5)
        view = torch.int32 if dtype == torch.float32 else torch.int16
        bad += int((got.view(view) != trained[rows].view(view)).sum())
    return bad


results = []
for block_n, block_m, warps, stages in CONFIGS:
    name = f"n{block_n}_m{block_m}_w{warps}_s{stages}"
    try:
        bits = {}
        for dtype in (torch.bfloat16, torch.float32):
            tag = str(dtype).removeprefix("torch.")
            constants = dict(block_n=block_n, block_m=block_m, num_warps=warps, num_stages=stages, input_dtype=tag, output_dtype=tag,
                             kv_cache_dtype=tag)
            bits[tag] = consistent(at.bench_op(**constants), dtype)
        impls = {"triton": at.bench_op(block_n=block_n, block_m=block_m, num_warps=warps, num_stages=stages)}
        g = torch.Generator(dev).manual_seed(0)
        rows = [prefill(impls, n, HEADS, dev, torch.bfloat16, g) for n in (512, 2048, 8192)]
        rows += [decode(impls, 64, n, HEADS, dev, torch.bfloat16, g) for n in (512, 2048, 8192)]
        rows += [decode(impls, 1, 2048, HEADS, dev, torch.bfloat16, g)]
        line = "  ".join(f"{r['form'][:3]} b{r['batch']} {r['keys']}: {r.get('triton_vs_sdpa', float('nan')):.2f}" for r in rows)
        print(f"{name}: decode vs trainer rows differing bf16 {bits['bfloat16']} fp32 {bits['float32']} | {line}", flush=True)
        results.append(dict(config=name, differing=bits, rows=rows))
    except Exception as error:  # noqa: BLE001
        print(f"{name}: failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}", flush=True)
        results.append(dict(config=name, error=str(error)[:400]))
    torch.cuda.empty_cache()
json.dump(results, open(os.path.join(os.environ.get("OUT", "."), "attn_fold.json"), "w"), indent=1)
