"""attention.triton's kernel on one call at Qwen3-8B's heads (32 query heads, 8 KV heads of 128, bf16), three times:
a target for Nsight Compute, which the device image has. `prefill L`: one packed sequence of L tokens; `decode BxK`: B
queries over a paged cache of K keys each (`attention_blocks.case`; batches that take the spread decode run its three
kernels instead, so name `block_` kernels there).

    PYTHONPATH=src ncu --kernel-name regex:attention_fwd_kernel --launch-skip 2 --launch-count 1 --set full \
        --import-source yes -o OUT/prefill python3 benchmarks/profile_attention.py prefill 8192 [--block-n 32] [--pairs 1]
    ncu -i OUT/prefill.ncu-rep --page details > details.txt
    ncu -i OUT/prefill.ncu-rep --page source --csv --print-source sass > sass.csv   # stall samples per instruction
"""
import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from attention_blocks import case, prefill_case  # noqa: E402
from isoexec.ops.attention import triton as attention_triton  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("form", choices=("prefill", "decode"))
    parser.add_argument("size", help="prefill: tokens; decode: batch x keys, e.g. 64x512")
    parser.add_argument("--block-n", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=1, help="attention.triton.PAIRS (1 or 0)")
    args = parser.parse_args()
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    if args.form == "prefill":
        call, _ = prefill_case(int(args.size), generator, device)
    else:
        batch, keys = map(int, args.size.split("x"))
        call, _, _ = case(batch, keys, generator, device)
    attention_triton.PAIRS = bool(args.pairs)
    op = attention_triton.bench_op(block_n=args.block_n)
    for _ in range(3):
        op(*call)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
