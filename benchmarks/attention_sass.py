"""attention.triton's tiles compiled for Hopper (sm_90a) on any machine, no GPU needed: registers, spills, shared memory,
and the hottest loop's SASS (the loop with the most wgmma instructions, between a backward branch and its target) by
instruction class. On an H100 the prefill tile is latency-bound with one program an SM (Nsight Compute:
benchmarks/results/2026-12-06_688e4cf_h100_attention_ftz/), so the instructions a warp issues per key block are a
first measure of a change before any device time; timings still decide.

    env -u TRITON_INTERPRET PYTHONPATH=src python3 benchmarks/attention_sass.py [--block-n 32] [--sass FILE]

Forms, at Qwen3-8B's heads (4 query heads per KV head of 128, bf16), as `attention_fwd` launches them: the stacked
prefill tile (128 rows, 8 warps, pairs of blocks) and the one-query decode tile (64 rows, 4 warps, pairs), each with
whole blocks checked and the blocks of the tile's own positions too (`CHECKED` and `DIAGONAL`, the default), whole
blocks checked (`CHECKED`), and masked. Beside the hottest loop, every loop with wgmma instructions and its length: the
pairs of whole blocks, single whole blocks, the blocks of the tile's positions.

Then the spread decode's two blocks kernels (`triton_blocks.py`, batch 1-8): their loops with wgmma instructions and
lengths (the max kernel's a run of MAX_RUN blocks, the terms kernel's a block; each kernel's loop over the blocks wholly
below the row, then the one over the row's last block or run).
"""
import argparse
import collections
import pathlib
import re
import subprocess
import tempfile

import triton
from sm90 import compile_kernel, ptxas

from isoexec.ops.attention import triton as attention_triton
from isoexec.ops.attention import triton_blocks
from isoexec.ops.attention.triton import attention_fwd_kernel

CUOBJDUMP = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
TYPES = {n: "*bf16" for n in ("q", "k", "v", "o")} | {"lse": "*fp32", "slot_table": "*i64", "seq_ids": "*i64", "positions": "*i64"}
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
CLASSES = [  # (class, opcode prefixes), first match wins
    ("mma and its waits", ("HGMMA", "WARPGROUP")),
    ("exp", ("MUFU",)),
    ("fp32 fma", ("FFMA",)),
    ("fp32 other", ("FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "F2FP")),
    ("integer and predicates", ("ISETP", "IMAD", "IADD", "LEA", "SEL", "LOP", "SHF", "P2R", "R2P", "PLOP", "VIADD", "IABS", "ISCADD")),
    ("uniform datapath", ("U", "R2UR", "S2UR", "S2R")),
    ("global and shared memory", ("LDG", "STG", "LDS", "STS", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDSM", "STL", "LDL")),
    ("barriers and branches", ("BAR", "BRA", "BSYNC", "BSSY", "WARPSYNC", "EXIT", "YIELD")),
    ("shuffles", ("SHFL",)),
]


def forms(block_n: int):
    """(name, constexprs, num_warps) of each form."""
    base = dict(G=4, G_PAD=4, D=128, HAS_WINDOW=False, DOT_IN_FP32=False, SUM_BY_DOT=False, BLOCK_N=block_n, WITH_LSE=False,
                SPAN=0, PAIRED=True, HEADS_FASTEST=attention_triton.HEADS_FASTEST, PROLOGUE=attention_triton.PREFETCH_PROLOGUE)
    for checked, diagonal, tag in ((True, True, "checked, diagonal"), (True, False, "checked"), (False, False, "masked")):
        yield f"prefill, stacked, {tag}", base | dict(BLOCK_Q=32, ROWS=128, QUERIES=32, CHECKED=checked, DIAGONAL=diagonal, PDL=True), 8
        yield f"decode, one query, {tag}", base | dict(BLOCK_Q=16, ROWS=64, QUERIES=1, CHECKED=checked, DIAGONAL=diagonal, PDL=True), 4


def sass(cubin: bytes) -> list[tuple[int, str]]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(CUOBJDUMP), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return [(int(address, 16), instruction.strip()) for address, instruction in LINE.findall(text)]


def mma_loops(code: list[tuple[int, str]]) -> list[tuple[int, int, int]]:
    """(first, last, wgmma count) of every innermost backward-branch loop (one that holds no other loop with wgmma)
    with wgmma instructions, in code order."""
    at = {address: i for i, (address, _) in enumerate(code)}
    loops = []
    for i, (_, instruction) in enumerate(code):
        target = re.search(r"BRA\s+(?:\S+\s+)?0x([0-9a-f]+)", instruction)
        if target and int(target.group(1), 16) in at and at[int(target.group(1), 16)] < i:
            start = at[int(target.group(1), 16)]
            mma = sum("HGMMA" in text for _, text in code[start : i + 1])
            if mma:
                loops.append((start, i, mma))
    return sorted((a, b, n) for a, b, n in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d, _ in loops))


def hottest_loop(code: list[tuple[int, str]]) -> list[str]:
    """The instructions of the innermost loop with the most wgmma instructions: a pair of key blocks in the forms here."""
    inner = mma_loops(code)
    if not inner:
        return []
    a, b, _ = max(inner, key=lambda loop: (loop[2], loop[0] - loop[1]))
    return [text for _, text in code[a : b + 1]]


def opcode(instruction: str) -> str:
    words = instruction.split()
    return words[1] if words[0].startswith("@") else words[0]


def classify(loop: list[str]) -> dict:
    counts = collections.Counter()
    for instruction in loop:
        op = opcode(instruction)
        counts[next((name for name, prefixes in CLASSES if op.startswith(prefixes)), "other")] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-n", type=int, default=32, help="key block (the presets': 32)")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--sass", help="also write each form's whole SASS here (appended)")
    args = parser.parse_args()
    for name, constants, num_warps in forms(args.block_n):
        kernel = compile_kernel(attention_fwd_kernel, constants, lambda n: TYPES.get(n, "fp32" if n == "scale" else "i32"), num_warps,
                                args.stages, aligned=lambda n, t: n in TYPES or n.startswith("stride"))
        registers, spills = ptxas(kernel.asm["ptx"])
        code = sass(kernel.asm["cubin"])
        loop = hottest_loop(code)
        counts = classify(loop)
        print(f"{name:<26} registers {registers}, spill stores {spills} B, shared {kernel.metadata.shared} B, SASS {len(code)}; "
              f"hottest loop {len(loop)} instructions ({sum('HGMMA' in t for t in loop)} wgmma): "
              + ", ".join(f"{k} {v}" for k, v in counts.most_common())
              + "; loops with wgmma (instructions): " + ", ".join(str(b - a + 1) for a, b, _ in mma_loops(code)), flush=True)
        if args.sass:
            with open(args.sass, "a") as f:
                f.write(f"# {name}\n" + "\n".join(f"/*{a:04x}*/ {t}" for a, t in code) + "\n")
    spread_kernels()


def spread_kernels() -> None:
    from pdl_ptx import HEADS, TYPES as SPREAD_TYPES

    common = HEADS | dict(DOT_IN_FP32=False, ROWS=64, NB=64, INTERPRETED=False, STAGES=triton_blocks.BLOCK_STAGES)
    for kernel, constants in ((triton_blocks.block_max_kernel, dict(RUN=triton_blocks.MAX_RUN, AHEAD=triton_blocks.MAX_SLOTS_AHEAD)),
                              (triton_blocks.block_terms_kernel, dict(SUM_BY_DOT=False, MAX_CHUNK=64))):
        compiled = compile_kernel(kernel, common | constants, lambda n: SPREAD_TYPES.get(n, "i32"), 4, 3,
                                  aligned=lambda n, t: n in SPREAD_TYPES or (n.startswith("stride") and n != "stride_sb"))
        registers, spills = ptxas(compiled.asm["ptx"])
        code = sass(compiled.asm["cubin"])
        print(f"{kernel.fn.__name__:<18} registers {registers}, spill stores {spills} B; loops with "
              "wgmma (instructions): " + ", ".join(str(b - a + 1) for a, b, _ in mma_loops(code)), flush=True)

if __name__ == "__main__":
    main()
