"""Registers and spills of gdn.core.triton's kernels compiled for Hopper on this machine (no GPU needed): each
forward and backward kernel built for sm_90a by Triton at Qwen3.5-9B's GDN heads (16 key / 32 value heads of
128, bf16, the contract's chunk of 16 forward, the backward's own tiles), then `ptxas -v` on its PTX.

A spill is local-memory traffic on every use of the spilled value: a kernel whose registers fit has none. This is
how a change meant to relieve a kernel's registers is checked before a GPU times it.

    PYTHONPATH=src python3 benchmarks/gdn_registers.py [--walk-block 64] [--bwd-walk-block 64] [--bwd-walk-stages 2] [--out DIR]   # from the repository root
"""

import argparse
import inspect
import pathlib
import sys
import tempfile

from sm90 import PTXAS, compile_kernel as compile_sm90, ptxas

from isoexec.ops.gdn import triton as fwd, triton_bwd as bwd, triton_two_launch as two

HEADS = dict(GROUP=2, HV=32, HK=16, DK=128, DV=128, DK_PAD=128, DV_PAD=128, SUB=16, PRECISION=2, ROWS=False, INTERPRET=False)
# Pointer arguments by name: bf16 operands and the buffers held as operands, int32 tables, the rest fp32.
BF16 = {"q", "k", "v", "a", "b", "out", "d_out", "dx", "x", "dv", "w_buf", "qn_buf", "scores_buf", "decayed_buf", "t_buf",
        "states", "dstates", "delta_buf", "d_delta_buf", "d_w_buf"}
INT32 = {"candidates", "state_ids", "run_first", "run_len", "run_chunk0", "chunk_run", "chunk_tok0", "chunk_off", "chunk_stop",
         "chunk_first", "chunk_len"}
INT64 = {"positions"}
FLOATS = {"q_scale", "scale"}


def arg_type(name: str) -> str:
    if name in FLOATS:
        return "fp32"
    if name.startswith("stride") or name in ("T", "has_cache", "every_token", "num_tokens"):
        return "i32"
    return "*bf16" if name in BF16 else "*i32" if name in INT32 else "*i64" if name in INT64 else "*fp32"


def compile_kernel(kernel, constants: dict, num_warps: int, num_stages: int) -> tuple[str, int]:
    """The kernel's PTX for sm_90a, every pointer 16-byte aligned (as the wrappers pass them), and its bytes of
    shared memory."""
    compiled = compile_sm90(kernel, constants, arg_type, num_warps, num_stages, aligned=lambda name, type_: type_.startswith("*"))
    return compiled.asm["ptx"], compiled.metadata.shared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walk-block", type=int, default=fwd.WALK_BLOCK_V or 128, help="the two-launch walk's value columns")
    parser.add_argument("--bwd-walk-block", type=int, default=bwd.WALK_BLOCK_V or bwd.BLOCK_V, help="the backward walks' value columns")
    parser.add_argument("--bwd-walk-stages", type=int, default=bwd.WALK_STAGES,
                        help="the backward walks' loop: 0 a while, n >= 2 a for pipelined n - 1 chunks ahead")
    parser.add_argument("--out", help="keep the PTX files in this folder")
    args = parser.parse_args()
    if not PTXAS.exists():
        sys.exit(f"no ptxas at {PTXAS}: Triton's NVIDIA backend is needed")
    forward = dict(HEADS, C=16, BV=128, SPLIT=False)
    backward = dict(HEADS, C=bwd.CHUNK, BV=bwd.BLOCK_V, BT=bwd.NORM_TOKENS, INPUTS=bwd.WALK_INPUTS)
    walks = dict(backward, BV=args.bwd_walk_block, NV=-(-HEADS["DV"] // args.bwd_walk_block), STAGES=args.bwd_walk_stages)
    kernels = [
        ("gdn_fwd_kernel (block_v 128)", fwd.gdn_fwd_kernel, forward, 4, 3),
        *((f"gdn_fwd_kernel (a decode step split in {block})", fwd.gdn_fwd_kernel, dict(forward, BV=block, SPLIT=True), 4, 3)
          for block, _ in fwd.SPLITS),
        ("gdn_chunks_kernel", two.gdn_chunks_kernel, forward, 4, 3),
        ("gdn_fwd_kernel (block_v 128, inverse by rows)", fwd.gdn_fwd_kernel, dict(forward, ROWS=True), 4, 3),
        *((f"gdn_fwd_kernel (a decode step split in {block}, inverse by rows)", fwd.gdn_fwd_kernel,
           dict(forward, BV=block, SPLIT=True, ROWS=True), 4, 3) for block, _ in fwd.SPLITS),
        ("gdn_chunks_kernel (inverse by rows)", two.gdn_chunks_kernel, dict(forward, ROWS=True), 4, 3),
        (f"gdn_walk_kernel ({args.walk_block} columns, prefetch {int(fwd.WALK_PREFETCH)})", two.gdn_walk_kernel,
         dict(forward, BV=args.walk_block, PREFETCH=fwd.WALK_PREFETCH), 4, 3),
        (f"gdn_walk_kernel ({args.walk_block} columns, inverse by rows)", two.gdn_walk_kernel,
         dict(forward, BV=args.walk_block, PREFETCH=fwd.WALK_PREFETCH, ROWS=True), 4, 3),
        ("gdn_bwd_wy_kernel", bwd.gdn_bwd_wy_kernel, backward, bwd.NUM_WARPS, bwd.NUM_STAGES),
        ("gdn_bwd_walk_inputs_kernel", bwd.gdn_bwd_walk_inputs_kernel, backward, bwd.NUM_WARPS, bwd.NUM_STAGES),
        ("gdn_bwd_states_kernel", bwd.gdn_bwd_states_kernel, walks, bwd.NUM_WARPS, bwd.NUM_STAGES),
        ("gdn_bwd_dstates_kernel", bwd.gdn_bwd_dstates_kernel, walks, bwd.NUM_WARPS, bwd.NUM_STAGES),
        ("gdn_bwd_walks_kernel (the two above in one launch)", bwd.gdn_bwd_walks_kernel, walks, bwd.NUM_WARPS, bwd.NUM_STAGES),
        (f"gdn_bwd_walks_kernel (inputs {'computed' if bwd.WALK_INPUTS else 'loaded'})", bwd.gdn_bwd_walks_kernel,
         dict(walks, INPUTS=not bwd.WALK_INPUTS), bwd.NUM_WARPS, bwd.NUM_STAGES),
        (f"gdn_bwd_walks_kernel (stages {2 if not args.bwd_walk_stages else 0}, inputs loaded)", bwd.gdn_bwd_walks_kernel,
         dict(walks, INPUTS=True, STAGES=2 if not args.bwd_walk_stages else 0), bwd.NUM_WARPS, bwd.NUM_STAGES),
        ("gdn_bwd_outputs_kernel", bwd.gdn_bwd_outputs_kernel, backward, bwd.CHUNK_WARPS, bwd.NUM_STAGES),
        ("gdn_bwd_wy_grads_kernel", bwd.gdn_bwd_wy_grads_kernel, backward, bwd.CHUNK_WARPS, bwd.NUM_STAGES),
        ("gdn_bwd_chunk_kernel (the two above as one: SPLIT off)", bwd.gdn_bwd_chunk_kernel, backward, bwd.CHUNK_WARPS, bwd.NUM_STAGES),
    ]
    with tempfile.TemporaryDirectory() as scratch:
        folder = pathlib.Path(args.out or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"{'kernel':<56} {'warps':>5} {'registers':>9} {'spilled bytes':>13} {'shared bytes':>12}")
        for title, kernel, constants, warps, stages in kernels:
            used = {k: v for k, v in constants.items() if k in inspect.signature(kernel.fn).parameters}
            ptx, shared = compile_kernel(kernel, used, warps, stages)
            registers, spilled = ptxas(ptx, folder, kernel.fn.__name__)
            print(f"{title:<56} {warps:>5} {registers:>9} {spilled:>13} {shared:>12}", flush=True)


if __name__ == "__main__":
    main()
