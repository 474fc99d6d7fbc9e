"""attention.triton decode at batch 1..64 against flash, per num_stages / warps: is the walk latency-bound?"""
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from isoexec.ops.attention import paged_slot_table
from isoexec.ops.attention import triton as at
from timing import graphed_ms
dev, dim = torch.device("cuda"), 128
randn = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16)
for heads, kvh in ((16, 8), (32, 8)):
    for batch, keys in ((1, 192), (1, 2048), (64, 192), (64, 2048)):
        pages = torch.randperm(batch * keys // 16, device=dev).reshape(batch, keys // 16)
        ks, vs = randn(batch * keys, kvh, dim), randn(batch * keys, kvh, dim)
        q = randn(batch, heads, dim); seq = torch.arange(batch, device=dev); pos = torch.full((batch,), keys - 1, device=dev)
        table = paged_slot_table(pages, 16, keys)
        args = (q, ks, vs, table, seq, pos, dim ** -0.5)
        dense = [q[:, :, None], *(s[table].transpose(1, 2).repeat_interleave(heads // kvh, 1) for s in (ks, vs))]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fl = graphed_ms(lambda: F.scaled_dot_product_attention(*dense), dev)
        listed = at.bench_op()(*args)
        line = []
        for w, st in ((4, 1), (4, 2), (4, 3), (4, 4), (4, 5), (8, 3)):
            op = at.bench_op(num_warps=w, num_stages=st)
            try:
                same = torch.equal(op(*args).view(torch.int16), listed.view(torch.int16))
                ms = graphed_ms(lambda op=op: op(*args), dev)
                line.append(f"w{w}s{st} {ms*1000:.1f}us{'' if same else ' DIFF'}")
            except Exception as e:
                line.append(f"w{w}s{st} {type(e).__name__}")
        print(f"heads {heads}/{kvh} batch {batch} keys {keys}: flash {fl*1000:.1f}us | " + " | ".join(line), flush=True)
