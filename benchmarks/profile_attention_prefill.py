"""One packed prefill of `length` tokens through attention.triton at Qwen3-8B's heads (32 query heads, 8 KV heads of
128, bf16), three calls: a target for Nsight Compute, which the device image has.

    PYTHONPATH=src ncu --kernel-name regex:attention_fwd_kernel --launch-skip 2 --launch-count 1 --set full \
        --import-source yes -o OUT/prefill python3 benchmarks/profile_attention_prefill.py [length] [block_n] [pairs]
    ncu -i OUT/prefill.ncu-rep --page details > details.txt
    ncu -i OUT/prefill.ncu-rep --page source --csv --print-source sass > sass.csv   # stall samples per instruction
"""
import sys

import torch

from isoexec.ops.attention import triton as attention_triton
from isoexec.ops.attention.metadata import packed_slot_table


def main() -> None:
    length, block_n, pairs = (int(a) for a in (sys.argv[1:] + ["8192", "32", "1"][len(sys.argv) - 1 :]))
    generator = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(length, 32, 128, generator=generator, device="cuda").bfloat16()
    k, v = (torch.randn(length, 8, 128, generator=generator, device="cuda").bfloat16() for _ in range(2))
    call = (q, k, v, *packed_slot_table(torch.tensor([0, length], device="cuda")), 128**-0.5)
    attention_triton.PAIRS = bool(pairs)
    op = attention_triton.bench_op(block_n=block_n)
    for _ in range(3):
        op(*call)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
