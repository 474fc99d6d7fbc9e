"""Saves rms_norm.triton outputs (and per-launch graphed times) for seeded inputs; run under two trees and compare."""
import os, sys, torch
from isoexec.ops.rms_norm import triton as norm
from isoexec.ops.rms_norm.tuning import HOPPER_CONSTANTS
sys.path.insert(0, "benchmarks")
from timing import graphed_ms
dev = torch.device("cuda")
g = torch.Generator().manual_seed(1)
res, times = {}, {}
for rows, h in ((1, 4096), (64, 4096), (300, 4096), (1, 1024), (64, 1024), (5, 2048), (9, 128), (3, 768), (4, 5000)):
    c = HOPPER_CONSTANTS.get(h, dict(reduce_block=1024, num_warps=4))
    for dtype in (torch.bfloat16, torch.float32):
        x = (torch.randn(rows, h, generator=g) * 3).to(dtype).to(dev)
        r = torch.randn(rows, h, generator=g).to(dtype).to(dev)
        w = torch.randn(h, generator=g).to(dtype).to(dev)
        for resid in (False, True):
            for zc in (False, True):
                y, s = norm.rms_norm_fwd(x, r if resid else None, w, 1e-6, zc, dtype, **c)
                res[(rows, h, str(dtype), resid, zc)] = (y.cpu(), s.cpu())
        if dtype == torch.bfloat16 and h in (4096, 1024):
            def fn():
                for _ in range(50):
                    norm.rms_norm_fwd(x, r, w, 1e-6, False, dtype, **c)
            times[(rows, h)] = graphed_ms(fn, dev) / 50 * 1e3
            print(rows, h, "us/launch", times[(rows, h)], flush=True)
torch.save(dict(res=res, times=times), os.path.join(os.environ["OUT"], sys.argv[1]))
