"""Host time per call of the preset's attention, stacked tiles on and off; cProfile of the stacked call."""
import cProfile, pstats, time, io
import torch
from isoexec.ops.attention import packed_slot_table
from isoexec.ops.attention import triton as at

dev, dim = torch.device("cuda"), 128
g = torch.Generator().manual_seed(0)
rnd = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).to(dev)  # noqa: E731
op = at.bench_op()
table, seq_ids, positions = packed_slot_table(torch.arange(2, device=dev) * 512)
q, k, v = rnd(512, 32, dim), rnd(512, 8, dim), rnd(512, 8, dim)
call = lambda: op(q, k, v, table, seq_ids, positions, dim ** -0.5)  # noqa: E731
orig = getattr(at, "_warpgroup_mma", None)
for label, fn in (("stacked", orig), ("lone", lambda d: False), ("stacked again", orig)):
    at._warpgroup_mma = fn
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        call()
        torch.cuda.synchronize()
    both = (time.perf_counter() - t0) / 100 * 1e6
    t0 = time.perf_counter()
    for _ in range(100):
        call()
    host = (time.perf_counter() - t0) / 100 * 1e6
    torch.cuda.synchronize()
    print(f"{label}: host per call {host:.1f} us, call + sync {both:.1f} us, launches cached: {len(at.attention_fwd_kernel.launches)}", flush=True)
at._warpgroup_mma = orig
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    call()
pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
print(s.getvalue())
