"""attention.triton with `split_kv_size` > 0 (each row's walk restarted every span of keys, the spans combined in order)
against the one-pass walk and flash SDPA, at Qwen3-8B's heads (32 query heads, 8 KV heads of 128, bf16).

decode:  one query per sequence over a paged cache (`attention_blocks.case`), as CUDA-graph replays: the preset's path
         (split 0: the walk or the spread decode), and per span size the spans in two launches (`triton_spans.py`);
         `differing` counts elements (int16 views) where the two launches and the walk over the same spans in one
         program (ISOEXEC_ATTENTION_SPANS=0's path) differ: must be 0.
prefill: one sequence of L tokens packed (`packed_slot_table`), kernel time, split 0 and each span size, against flash
         SDPA's causal call on the same values; `moved` counts output elements whose bits the spans changed (rows
         past the first span do other arithmetic: expected > 0).

    cd benchmarks && PYTHONPATH=../src python3 attention_spans.py [--spans 128,256,512] [--decode 1x2048,...]
        [--prefill 2048,8192] [--pairs] [--tile num_warps=8] [--out FILE] [--device cpu]

Each row is printed (and appended to --out) as soon as it is measured.
"""
import argparse
import contextlib

import torch

from attention_blocks import case, flash_decode_ms, prefill_case
from isoexec.ops.attention import triton as attention_triton
from isoexec.ops.attention import triton_spans
from timing import graphed_ms, kernel_ms


def _emit(line: str, out: str | None) -> None:
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


@contextlib.contextmanager
def _set(module, name: str, value):
    """module.name = value for the `with` block."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def _spans_off(op):
    def run(*call):
        with _set(triton_spans, "ENABLED", False):
            return op(*call)
    return run


def _timed_variant(op, call, want, module, name: str, value, device) -> tuple[bool, float]:
    """(whether op's output keeps want's bits, its time) with module.name = value."""
    with _set(module, name, value):
        return torch.equal(op(*call).view(torch.int16), want), kernel_ms(lambda: op(*call), device)


def decode(sizes: list[str], spans: list[int], device, generator, out, tile: dict) -> None:
    base = attention_triton.bench_op()
    for size in sizes:
        batch, keys = map(int, size.split("x"))
        call, k, v = case(batch, keys, generator, device)
        flash_ms = flash_decode_ms(call, k, v, device)
        base_ms = graphed_ms(lambda: base(*call), device)
        parts = [f"decode batch {batch:<3} keys {keys:<5} flash {flash_ms * 1e3:7.1f} us  split 0 {base_ms * 1e3:7.1f} us "
                 f"({flash_ms / base_ms:.2f})"]
        for span in spans:
            op = attention_triton.bench_op(**tile, split_kv_size=span)
            differing = int((op(*call).view(torch.int16) != _spans_off(op)(*call).view(torch.int16)).sum())
            ms = graphed_ms(lambda: op(*call), device)
            parts.append(f"span {span} {ms * 1e3:7.1f} us ({flash_ms / ms:.2f}, differing {differing})")
        _emit("  ".join(parts), out)


def prefill(lengths: list[int], spans: list[int], device, generator, out, pairs: bool, tile: dict) -> None:
    for length in lengths:
        call, flash_ms = prefill_case(length, generator, device)
        base = attention_triton.bench_op()
        want = base(*call).view(torch.int16)
        base_ms = kernel_ms(lambda: base(*call), device)
        parts = [f"prefill keys {length:<5} flash {flash_ms:7.3f} ms  split 0 {base_ms:7.3f} ms ({flash_ms / base_ms:.2f})"]
        if pairs:  # split 0 with its tiles' pairs of blocks off (PAIRS): what the spans' tiles, which take none, start from
            same, single_ms = _timed_variant(base, call, want, attention_triton, "PAIRS", False, device)
            parts.append(f"unpaired {single_ms:7.3f} ms (same bits {same})")
        for span in spans:
            op = attention_triton.bench_op(**tile, split_kv_size=span)
            got = op(*call).view(torch.int16)
            moved = int((got != want).sum())
            ms = kernel_ms(lambda: op(*call), device)
            parts.append(f"span {span} {ms:7.3f} ms ({flash_ms / ms:.2f}, moved {moved})")
            if pairs:  # the tiles' pairs of blocks on (PAIRS_WITH_SPANS): the same bits
                same, paired_ms = _timed_variant(op, call, got, attention_triton, "PAIRS_WITH_SPANS", True, device)
                parts.append(f"paired {paired_ms:7.3f} ms (same bits {same})")
        _emit("  ".join(parts), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", default="128,256,512", help="split_kv_size values (keys, multiples of 32), comma-separated")
    parser.add_argument("--decode", default="1x512,1x2048,1x8192,4x2048,8x2048,64x512,64x2048",
                        help="batch x keys, comma-separated ('' for none)")
    parser.add_argument("--prefill", default="2048,8192", help="sequence lengths, comma-separated ('' for none)")
    parser.add_argument("--tile", default="", help="the spans' tile constants where not the preset's, e.g. num_warps=8 (split 0 keeps "
                                                   "the preset's)")
    parser.add_argument("--pairs", action="store_true", help="prefill: also time split 0 without pairs of blocks, and the spans' "
                                                             "tiles with them")
    parser.add_argument("--out", help="append each row here too")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run in the interpreter (TRITON_INTERPRET=1; no flash)")
    args = parser.parse_args()
    device = torch.device(args.device)
    spans = [int(s) for s in args.spans.split(",")]
    generator = torch.Generator(device=device).manual_seed(0)
    tile = dict(item.split("=") for item in args.tile.split(",") if item)
    tile = {name: int(value) for name, value in tile.items()}
    decode([s for s in args.decode.split(",") if s], spans, device, generator, args.out, tile)
    prefill([int(s) for s in args.prefill.split(",") if s], spans, device, generator, args.out, args.pairs, tile)


if __name__ == "__main__":
    main()
