"""Seeded comparison: the one-program sampler (HEAD) vs the segmented one (2b53b7c), one process, same inputs."""
import importlib.util, json, os, sys
import torch
import isoexec.ops.sampling as pkg
from isoexec.ops.sampling import triton as one
sys.path.insert(0, "benchmarks")
from timing import graphed_ms

spec = importlib.util.spec_from_file_location("isoexec.ops.sampling._segmented", "build/seg/segmented.py")
seg = importlib.util.module_from_spec(spec); sys.modules[spec.name] = seg; spec.loader.exec_module(seg)

out = {}
dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
for rows, vocab in ((64, 151936), (1, 151936), (8, 151936), (64, 1000), (3, 4097)):
    x = torch.randn(rows, vocab, generator=g).log_softmax(-1)
    for dtype in (torch.bfloat16, torch.float32):
        xd = x.to(dtype).to(dev)
        for temp in (1.0, 0.7, 0.0):
            t = torch.full((rows,), temp, device=dev)
            k = torch.zeros(rows, dtype=torch.int64, device=dev)
            p = torch.ones(rows, device=dev)
            s = torch.arange(rows, dtype=torch.int64, device=dev)
            q = torch.arange(rows, dtype=torch.int64, device=dev) + 7
            ref, _ = one.draw_unfiltered(xd, t, k, p, s, q)
            res = {}
            for n in (None, 1, 2, 8, 38):
                tok, _ = seg.draw_unfiltered(xd, t, k, p, s, q, num_segments=n)
                res[str(n)] = int((tok != ref).sum())
            key = f"{rows}x{vocab} {dtype} t={temp}"
            out[key] = res
            print(key, res, flush=True)
# timing at Qwen3's vocab
for rows in (1, 64):
    xd = torch.randn(rows, 151936, generator=g).log_softmax(-1).bfloat16().to(dev)
    args = (xd, torch.ones(rows, device=dev), torch.zeros(rows, dtype=torch.int64, device=dev), torch.ones(rows, device=dev),
            torch.arange(rows, device=dev), torch.arange(rows, device=dev))
    a = graphed_ms(lambda: one.draw_unfiltered(*args), dev)
    b = graphed_ms(lambda: seg.draw_unfiltered(*args), dev)
    out[f"ms b{rows}"] = dict(one=a, segmented=b)
    print("ms", rows, a, b, flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "sampler_check.json"), "w"), indent=1)
