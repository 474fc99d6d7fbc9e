"""rms_norm.triton (with a residual) at hidden 4096: graphed us per launch for candidate (reduce_block, num_warps)."""
import os, sys, json, torch
sys.path.insert(0, "benchmarks")
from timing import graphed_ms
from isoexec.ops.rms_norm import triton as norm
dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
out = {}
for h in (4096, 2048, 5120):
    for rows in (1, 64, 512, 4096):
        x, r = (torch.randn(rows, h, generator=g).bfloat16().to(dev) for _ in range(2))
        w = torch.randn(h, generator=g).bfloat16().to(dev)
        for rb, nw in ((1024, 4), (2048, 8), (4096, 8), (4096, 16), (2048, 4), (1024, 8)):
            if rb > 2 * h: continue
            def fn():
                for _ in range(20):
                    norm.rms_norm_fwd(x, r, w, 1e-6, False, torch.bfloat16, reduce_block=rb, num_warps=nw)
            us = graphed_ms(fn, dev) / 20 * 1e3
            out[f"h{h} rows{rows} rb{rb} w{nw}"] = round(us, 2)
            print(h, rows, rb, nw, round(us, 2), flush=True)
json.dump(out, open(os.path.join(os.environ["OUT"], "norm_tiles.json"), "w"), indent=1)
