"""logprobs.triton at decode sizes: the whole-row kernel (SEGMENT_PROGRAMS = 1) vs rows split among programs,
graphed, and whether the bits agree."""
import sys, torch
sys.path.insert(0, "benchmarks")
from timing import graphed_ms
from isoexec.ops.logprobs import triton as lp
dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
for rows in (1, 8, 64, 256):
    x = (torch.randn(rows, 151936, generator=g) * 4).bfloat16().to(dev)
    cfg = dict(vocab_block=512, num_warps=4)
    split = lp.logprobs_fwd(x, torch.float32, **cfg)
    t_split = graphed_ms(lambda: lp.logprobs_fwd(x, torch.float32, **cfg), dev)
    saved = lp.SEGMENT_PROGRAMS
    lp.SEGMENT_PROGRAMS = 1
    whole = lp.logprobs_fwd(x, torch.float32, **cfg)
    t_whole = graphed_ms(lambda: lp.logprobs_fwd(x, torch.float32, **cfg), dev)
    lp.SEGMENT_PROGRAMS = saved
    same = torch.equal(split.view(torch.int32), whole.view(torch.int32))
    print(f"rows {rows}: segments {lp.segments(rows, 297)}  whole-row {t_whole*1e3:.1f} us  split {t_split*1e3:.1f} us  same bits {same}", flush=True)
