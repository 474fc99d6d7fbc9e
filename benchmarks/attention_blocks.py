"""attention.triton's decode rows by the walk (one program per query and KV head over every key block, the spread
path forced off) against the key blocks spread over the grid (`ops/attention/triton_blocks.py`, forced on), the walk's
tile in Gluon (`ops/attention/gluon_tile.py`, where it imports) and flash SDPA: the bits of each against the walk
(elements whose int16 views differ: must be 0) and each one's time as a CUDA-graph replay, at Qwen3-8B's heads
(32 query heads, 8 KV heads of 128, bf16), one query per sequence over a paged cache of `keys` keys.

    cd benchmarks && PYTHONPATH=../src python3 attention_blocks.py [--sizes 1x2048,1x8192,...] [--out FILE]

Each row is printed (and appended to --out) as soon as it is measured.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention import PAGE_SIZE, _randn
from isoexec.ops.attention import triton as attention_triton
from isoexec.ops.attention import gluon_tile, triton_blocks
from isoexec.ops.attention.metadata import packed_slot_table, paged_slot_table
from timing import graphed_ms, kernel_ms

HEADS = (32, 8, 128)


def case(batch: int, keys: int, generator: torch.Generator, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """One query per sequence at HEADS over a paged cache of `keys` keys (pages in random order, the rest NaN): the op's
    arguments, and K and V as [batch, KV heads, keys, D] for flash."""
    num_heads, num_kv_heads, head_dim = HEADS
    q = _randn(generator, batch, num_heads, head_dim, dtype=dtype)
    k, v = (_randn(generator, batch, num_kv_heads, keys, head_dim, dtype=dtype) for _ in range(2))
    pages = -(-keys // PAGE_SIZE)
    block_table = torch.randperm(batch * pages, generator=generator, device=device).view(batch, pages)
    slot_table = paged_slot_table(block_table, PAGE_SIZE, keys)
    k_store = torch.full((batch * pages * PAGE_SIZE, num_kv_heads, head_dim), float("nan"), device=device, dtype=dtype)
    v_store = k_store.clone()
    k_store[slot_table.flatten()] = k.transpose(1, 2).reshape(-1, num_kv_heads, head_dim)
    v_store[slot_table.flatten()] = v.transpose(1, 2).reshape(-1, num_kv_heads, head_dim)
    call = (q, k_store, v_store, slot_table, torch.arange(batch, device=device), torch.full((batch,), keys - 1, device=device),
            head_dim**-0.5)
    return call, k, v


def flash_decode_ms(call, k, v, device: torch.device) -> float:
    """Flash SDPA's decode of `case`'s queries over its K and V as a CUDA-graph replay, in ms (NaN off CUDA)."""
    if device.type != "cuda":
        return float("nan")
    q = call[0]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return graphed_ms(lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True, scale=q.shape[-1]**-0.5), device)


def prefill_case(length: int, generator: torch.Generator, device: torch.device, heads: tuple = HEADS, batch: int = 1,
                 timer=kernel_ms):
    """`batch` packed sequences of `length` tokens each at `heads`: the op's arguments, and flash SDPA's causal call on
    the same values timed by `timer` (`kernel_ms` or `graphed_ms`; ms, NaN off CUDA)."""
    num_heads, num_kv_heads, head_dim = heads
    scale = head_dim**-0.5
    q = _randn(generator, batch * length, num_heads, head_dim, dtype=torch.bfloat16)
    k, v = (_randn(generator, batch * length, num_kv_heads, head_dim, dtype=torch.bfloat16) for _ in range(2))
    flash_ms = float("nan")
    if device.type == "cuda":
        dense = [t.view(batch, length, *t.shape[1:]).transpose(1, 2).contiguous() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash_ms = timer(lambda: F.scaled_dot_product_attention(*dense, is_causal=True, enable_gqa=True, scale=scale), device)
    cu_seqlens = torch.arange(batch + 1, device=device) * length
    return (q, k, v, *packed_slot_table(cu_seqlens), scale), flash_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1x2048,1x8192,1x512,1x256,1x128,4x512,4x2048,8x2048,16x2048,64x512,64x2048",
                        help="batch x keys, comma-separated (the first ones first: a call cut short keeps them)")
    parser.add_argument("--out", help="append each row here too")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run in the interpreter (no flash)")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16
    op = attention_triton.bench_op()

    def forced(blocks_min, fill, gluon):
        def run(*call):
            saved = triton_blocks.BLOCKS_MIN, triton_blocks.BLOCKS_MAX_FILL, gluon_tile.ENABLED
            triton_blocks.BLOCKS_MIN, triton_blocks.BLOCKS_MAX_FILL, gluon_tile.ENABLED = blocks_min, fill, gluon
            try:
                return op(*call)
            finally:
                triton_blocks.BLOCKS_MIN, triton_blocks.BLOCKS_MAX_FILL, gluon_tile.ENABLED = saved
        return run

    walk, spread = forced(None, 0.0, False), forced(1, float("inf"), False)
    gluon = forced(None, 0.0, True) if device.type == "cuda" and gluon_tile.available() else None

    generator = torch.Generator(device=device).manual_seed(0)
    for size in args.sizes.split(","):
        batch, keys = map(int, size.split("x"))
        call, k, v = case(batch, keys, generator, device, dtype)
        want = walk(*call).view(torch.int16)
        differing = int((want != spread(*call).view(torch.int16)).sum())
        walk_ms, spread_ms = graphed_ms(lambda: walk(*call), device), graphed_ms(lambda: spread(*call), device)
        gluon_part = ""
        if gluon is not None:
            gluon_differing = int((want != gluon(*call).view(torch.int16)).sum())
            gluon_ms = graphed_ms(lambda: gluon(*call), device)
            gluon_part = f"  gluon {gluon_ms * 1e3:7.1f} us  gluon_differing {gluon_differing}"
        flash_ms = flash_decode_ms(call, k, v, device)
        line = (f"decode batch {batch:<3} keys {keys:<5} walk {walk_ms * 1e3:7.1f} us  spread {spread_ms * 1e3:7.1f} us  flash "
                f"{flash_ms * 1e3:7.1f} us  flash/walk {flash_ms / walk_ms:.2f}  flash/spread {flash_ms / spread_ms:.2f}  "
                f"differing {differing}{gluon_part}")
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
