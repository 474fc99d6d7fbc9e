"""Digests of attention.triton's outputs (SHA-256 of their int16 views) for decode calls at Qwen3-8B's heads (the
spread decode at batch 1-8, the walk at 64): run it from two trees on one GPU and diff the outputs to show that a change
moved no bit. One call has a table with keys outside the store (a slot of -1 and one
past it), which every form must skip.

    cd benchmarks && PYTHONPATH=<tree>/src python3 attention_digests.py > digests_<tree>.txt
"""
import argparse
import hashlib

import torch

import attention_blocks
from isoexec.ops.attention import triton as attention_triton

SIZES = ("1x512", "1x2048", "1x8192", "4x2048", "8x2048", "64x512", "3x1100")  # batch x keys; 3 x 1,100 holds the holes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help="batch x keys, comma-separated (3 x 1,100 holds the holes)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run in the interpreter (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    device = torch.device(args.device)
    attention_blocks.HEADS = (32, 8, 128)
    op = attention_triton.bench_op()
    generator = torch.Generator(device=device).manual_seed(0)
    every = hashlib.sha256()
    for size in args.sizes.split(","):
        batch, keys = map(int, size.split("x"))
        call, _, _ = attention_blocks.case(batch, keys, generator, device)
        if size == "3x1100":
            table = call[3].clone()
            table[0, 5], table[1, 600] = -1, call[1].shape[0] + 7
            call = call[:3] + (table,) + call[4:]
        digest = hashlib.sha256(op(*call).view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
        every.update(digest.encode())
        print(f"{size:<7} {digest}", flush=True)
    print(f"all     {every.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
