"""attention.triton at other tile constants than the preset's (key block, stages, pairs of blocks) against the preset
and flash SDPA, side by side in one run: prefill kernel time of packed sequences (one, or `B x L` of one length) and
decode graph replays over a paged cache, at Qwen3-8B's heads (32 query heads, 8 KV heads of 128, bf16) or others (--heads); prefill as CUDA-graph
replays with --graphs (a 512-token prefill's eager launch takes about as long as its kernel).

A variant that changes `block_n` changes the rows' bits (the walk's online-softmax steps are its key blocks): `moved`
counts prefill output elements whose int16 views differ from the preset's (> 0 expected there, 0 for a variant of
stages or pairs alone), and `decode=prefill` says whether four of the queries decoded over the same keys (one query
a sequence) have the prefill rows' bits under that variant (the contract's property: must be True). A decode row's
`preset's bits` compares the outputs as int16 and, written as fp32 by the same kernels, as int32: a bf16 output
seldom shows a one-ulp change in an fp32 row sum, an fp32 one does (`fp32 out`: the same count for prefill).

    cd benchmarks && PYTHONPATH=../src python3 attention_tiles.py [--variants "block_n=64,pairs=0;block_n=64,num_stages=2"]
        [--prefill 512,2048,8192,8x512] [--graphs] [--decode 1x2048,8x2048,64x512,64x2048] [--heads 32,8,128] [--out FILE] [--device cpu]

A variant is `name=value` items joined by commas: the op's constants (block_n, num_stages, num_warps, block_m),
`pairs`, `check_slots`, `check_decode`, `diagonal`, `decode_diagonal`, `heads_fastest` and `prologue` (0 or 1:
`attention.triton.PAIRS`, `CHECK_SLOTS`, `CHECK_DECODE_SLOTS`, `CHECK_DIAGONAL`, `CHECK_DECODE_DIAGONAL`, `HEADS_FASTEST`,
`PREFETCH_PROLOGUE`), and the spread decode's `waves`, `max_waves`, `fold_split`, `fold_warps`, `fold_max_split`,
`fold_unroll`, `fold_stages`, `max_chunk`, `max_run`, `block_stages` and `max_ahead` (`triton_blocks.PROGRAM_WAVES`,
`MAX_PROGRAM_WAVES`, `FOLD_SPLIT`, `FOLD_WARPS`, `FOLD_MAX_SPLIT`, `FOLD_UNROLL`, `FOLD_STAGES`, `MAX_CHUNK`, `MAX_RUN`,
`BLOCK_STAGES`, `MAX_SLOTS_AHEAD`; `fold_max_split` equal to `fold_split` keeps the fold at FOLD_SPLIT programs for
every call). Each row is printed (and appended to --out) as soon as it is measured.
"""
import argparse

import torch

import attention_blocks
from attention_spans import _emit
from isoexec.ops.attention import triton as attention_triton
from isoexec.ops.attention import triton_blocks
from timing import graphed_ms, kernel_ms


KNOBS = {  # variant item -> (module, constant); a module constant keeps its type (bool or int)
    "pairs": (attention_triton, "PAIRS"), "check_slots": (attention_triton, "CHECK_SLOTS"),
    "check_decode": (attention_triton, "CHECK_DECODE_SLOTS"), "diagonal": (attention_triton, "CHECK_DIAGONAL"),
    "decode_diagonal": (attention_triton, "CHECK_DECODE_DIAGONAL"), "waves": (triton_blocks, "PROGRAM_WAVES"),
    "max_waves": (triton_blocks, "MAX_PROGRAM_WAVES"),
    "fold_split": (triton_blocks, "FOLD_SPLIT"), "fold_warps": (triton_blocks, "FOLD_WARPS"), "fold_max_split": (triton_blocks, "FOLD_MAX_SPLIT"),
    "fold_unroll": (triton_blocks, "FOLD_UNROLL"), "fold_stages": (triton_blocks, "FOLD_STAGES"),
    "max_chunk": (triton_blocks, "MAX_CHUNK"), "max_run": (triton_blocks, "MAX_RUN"), "block_stages": (triton_blocks, "BLOCK_STAGES"),
    "heads_fastest": (attention_triton, "HEADS_FASTEST"), "prologue": (attention_triton, "PREFETCH_PROLOGUE"), "max_ahead": (triton_blocks, "MAX_SLOTS_AHEAD"),
}


def knob_value(current, value: int):
    """A knob's value in its constant's type (bool or int); where the constant is None (a rule), 0 keeps the rule."""
    return (value or None) if current is None else type(current)(value)


def _parse(variant: str) -> tuple[dict, dict]:
    items = dict(item.split("=") for item in variant.split(",") if item)
    knobs = {KNOBS[name]: knob_value(getattr(*KNOBS[name]), int(items.pop(name))) for name in list(items) if name in KNOBS}
    return {name: int(value) for name, value in items.items()}, knobs


def _op(constants: dict, knobs: dict):
    op = attention_triton.bench_op(**constants)

    def run(*call):
        saved = {knob: getattr(*knob) for knob in knobs}
        for (module, name), value in knobs.items():
            setattr(module, name, value)
        try:
            return op(*call)
        finally:
            for (module, name), value in saved.items():
                setattr(module, name, value)
    return run


def prefill(sizes, variants, heads, device, generator, out, timer=kernel_ms) -> None:
    for size in sizes:
        batch, length = map(int, size.split("x")) if "x" in size else (1, int(size))
        call, flash_ms = attention_blocks.prefill_case(length, generator, device, heads, batch, timer)
        q, k, v, slot_table, seq_ids, positions, scale = call
        base = attention_triton.bench_op()
        want = base(*call).view(torch.int16)
        timer(lambda: base(*call), device)  # discarded: the first timing after a compile read up to 2x slow
        base_ms = timer(lambda: base(*call), device)
        # Four of the last sequence's queries as a decode batch (one query a sequence, each its own copy of the table):
        # their rows must be the prefill's, bit for bit.
        picks = (batch - 1) * length + torch.tensor([length - 1, length - 2, length // 2 + 5, 40], device=device) % length
        table = slot_table[batch - 1 :].expand(4, -1).contiguous()
        last = (q[picks], k, v, table, torch.arange(4, device=device), positions[picks], scale)
        decoded = torch.equal(base(*last).view(torch.int16), want[picks])
        parts = [f"prefill {batch} x {length:<5} flash {flash_ms:7.3f} ms  preset {base_ms:7.3f} ms ({flash_ms / base_ms:.2f}, decode=prefill {decoded})"]
        want_fp32 = attention_triton.bench_op(output_dtype="float32")(*call).view(torch.int32)
        for variant in variants:
            constants, knobs = _parse(variant)
            op = _op(constants, knobs)
            got = op(*call).view(torch.int16)
            moved_fp32 = int((_op(constants | {"output_dtype": "float32"}, knobs)(*call).view(torch.int32) != want_fp32).sum())
            decoded = torch.equal(op(*last).view(torch.int16), got[picks])
            ms = timer(lambda: op(*call), device)
            parts.append(f"[{variant}] {ms:7.3f} ms ({flash_ms / ms:.2f}, moved {int((got != want).sum())} (fp32 out {moved_fp32}), "
                         f"decode=prefill {decoded})")
        _emit("  ".join(parts), out)


def decode(sizes, variants, heads, device, generator, out) -> None:
    attention_blocks.HEADS = heads
    base = attention_triton.bench_op()
    for size in sizes:
        batch, keys = map(int, size.split("x"))
        call, k, v = attention_blocks.case(batch, keys, generator, device)
        flash_ms = attention_blocks.flash_decode_ms(call, k, v, device)
        base_ms = graphed_ms(lambda: base(*call), device)
        parts = [f"decode batch {batch:<3} keys {keys:<5} flash {flash_ms * 1e3:7.1f} us  preset {base_ms * 1e3:7.1f} us "
                 f"({flash_ms / base_ms:.2f})"]
        want = base(*call).view(torch.int16)
        want_fp32 = attention_triton.bench_op(output_dtype="float32")(*call).view(torch.int32)
        for variant in variants:
            constants, knobs = _parse(variant)
            op = _op(constants, knobs)
            same = torch.equal(op(*call).view(torch.int16), want)
            same = same and torch.equal(_op(constants | {"output_dtype": "float32"}, knobs)(*call).view(torch.int32), want_fp32)
            ms = graphed_ms(lambda: op(*call), device)
            parts.append(f"[{variant}] {ms * 1e3:7.1f} us ({flash_ms / ms:.2f}, preset's bits {same})")
        _emit("  ".join(parts), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="", help="variants separated by ';', each name=value items joined by ',' (none: the preset and flash alone)")
    parser.add_argument("--prefill", default="512,2048,8192",
                        help="sequence lengths, or batch x length for packed sequences of one length, comma-separated ('' for none)")
    parser.add_argument("--graphs", action="store_true", help="time prefill (flash and ours) as CUDA-graph replays, not eager calls")
    parser.add_argument("--decode", default="1x2048,8x2048,64x512,64x2048", help="batch x keys, comma-separated ('' for none)")
    parser.add_argument("--heads", default="32,8,128", help="query heads, KV heads, head_dim")
    parser.add_argument("--out", help="append each row here too")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run in the interpreter (TRITON_INTERPRET=1; no flash)")
    args = parser.parse_args()
    device = torch.device(args.device)
    heads = tuple(int(h) for h in args.heads.split(","))
    variants = [v for v in args.variants.split(";") if v]
    for variant in variants:
        _parse(variant)  # a malformed variant fails before any timing
    generator = torch.Generator(device=device).manual_seed(0)
    _emit(f"heads {heads}, preset {attention_triton.HOPPER_CONSTANTS}, " + ", ".join(f"{name} {getattr(*knob)}" for name, knob in KNOBS.items()),
          args.out)
    prefill([s for s in args.prefill.split(",") if s], variants, heads, device, generator, args.out,
            graphed_ms if args.graphs else kernel_ms)
    decode([s for s in args.decode.split(",") if s], variants, heads, device, generator, args.out)


if __name__ == "__main__":
    main()
