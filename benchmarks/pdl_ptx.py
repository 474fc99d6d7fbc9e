"""Kernels compiled for sm_90a with programmatic dependent launch on and off (no GPU needed): whether their floating-point
and MMA instructions are the same sequence (register names aside), and how many `griddepcontrol` instructions PDL adds.
PDL changes when a kernel starts, not what it computes; this shows the compiler left the arithmetic alone.

    env -u TRITON_INTERPRET PYTHONPATH=src python3 benchmarks/pdl_ptx.py

The kernels: attention.triton's spread decode's dependent two (`ops/attention/triton_blocks.py`; its terms kernel
launches without PDL) at Qwen3-8B's heads (4 query heads
per KV head of 128, bf16, key blocks of 32).
"""
import re

from sm90 import compile_kernel

from isoexec.ops.attention import triton_blocks

FLOAT = re.compile(r"\.(f32|f16|bf16)\b|wgmma|mma\.|ex2|rcp|div")
TYPES = ({n: "*bf16" for n in ("q", "k", "v", "o")} | {n: "*i64" for n in ("slot_table", "seq_ids", "positions")}
         | {n: "*fp32" for n in ("maxima", "scores", "alphas", "sums", "pvs")} | {"scale": "fp32"})
HEADS = dict(G=4, G_PAD=4, D=128, BLOCK_N=32)
KERNELS = [  # (kernel, constexprs, num_warps, num_stages), as `triton_blocks.attention_decode` launches them
    (triton_blocks.block_max_kernel, HEADS | dict(DOT_IN_FP32=False, ROWS=64, NB=64, INTERPRETED=False, STAGES=triton_blocks.BLOCK_STAGES,
                                                 RUN=triton_blocks.MAX_RUN, AHEAD=triton_blocks.MAX_SLOTS_AHEAD), 4, 3),
    (triton_blocks.fold_kernel, HEADS | dict(D_PART=128, NB=64, INTERPRETED=False, STAGES=triton_blocks.FOLD_STAGES, UNROLL=1), 4, 1),
]


def ptx(kernel, constants: dict, num_warps: int, num_stages: int) -> str:
    return compile_kernel(kernel, constants, lambda name: TYPES.get(name, "i32"), num_warps, num_stages).asm["ptx"]


def float_ops(text: str) -> list[str]:
    return [re.sub(r"%[a-z]+\d+", "%R", line.strip()) for line in text.splitlines() if FLOAT.search(line)]


def main() -> None:
    for kernel, constants, num_warps, num_stages in KERNELS:
        off, on = (ptx(kernel, constants | {"PDL": pdl}, num_warps, num_stages) for pdl in (False, True))
        same = float_ops(off) == float_ops(on)
        print(f"{kernel.fn.__name__:<20} float and MMA instructions {len(float_ops(off))} / {len(float_ops(on))}  same sequence: {same}  "
              f"griddepcontrol {off.count('griddepcontrol')} / {on.count('griddepcontrol')}", flush=True)


if __name__ == "__main__":
    main()
