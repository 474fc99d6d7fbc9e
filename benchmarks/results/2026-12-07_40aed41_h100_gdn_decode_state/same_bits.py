"""gdn.core.triton's outputs over prefill (mixed runs, mid-chunk continuation) and decode steps, saved for a tree."""
import sys, torch
from isoexec.ops.gdn import triton as T
dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
g = torch.Generator().manual_seed(0)
HK, HV, DK, DV, C = (2, 4, 16, 8, 16) if dev == "cpu" else (16, 32, 128, 128, 16)
N = 4
def r(*s, dt=torch.bfloat16):
    return torch.randn(*s, generator=g).to(dt).to(dev)
a_log, dt_bias = r(HV, dt=torch.float32), r(HV, dt=torch.float32)
state = torch.full((N, HV, DK, DV), float("nan"), device=dev)
import inspect
width = T.row_width(HV, DK, DV, {}) if len(inspect.signature(T.row_width).parameters) == 4 else T.row_width(HV, DK, DV)
rows = torch.full((N, C, HV, width), float("nan"), device=dev)
kw = dict(input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32", chunk_size=C, dot_precision="bf16", block_v=128,
          num_warps=4)
outs = []
pos_now = [0] * N
def call(lens, slots):
    pos, ids = [], []
    for n, s in zip(lens, slots):
        pos += range(pos_now[s], pos_now[s] + n); ids += [s] * n; pos_now[s] += n
    t = len(pos)
    out = T.gdn_core(r(t, HK, DK), r(t, HK, DK), r(t, HV, DV), r(t, HV), r(t, HV), a_log, dt_bias, state, rows,
                     torch.tensor(ids, dtype=torch.int32, device=dev), torch.tensor(pos, dtype=torch.int64, device=dev), **kw)
    outs.append(out.cpu())
call([5, 23, 40], [2, 0, 3])        # prefill: runs that end mid-chunk, on a boundary's far side, several chunks
call([7, 9, 3, 1], [0, 2, 3, 1])    # continuing open chunks
for _ in range(20):                 # decode steps across boundaries
    call([1, 1, 1, 1], [3, 1, 0, 2])
call([1, 1, 30], [3, 1, 0])        # a mixed call
torch.save(outs, sys.argv[1])
print("saved", len(outs), "calls")
