"""Decode steps of gdn.core.triton with the value columns split over the grid (`SPLITS`, ops/gdn/triton.py)
against the contract's one block a program, beside flash-linear-attention's recurrent step: the time per step over a
whole chunk (16 steps from a chunk's first offset, one CUDA graph, as `bench.py gdn` times "decode chunk"), and the
elements whose bits differ from the unsplit steps' (they must be none), in the outputs and in the state the chunk's
last step writes.

A batch-1 step has 32 programs at Qwen3.5-9B's heads, each with a 128 x 128 fp32 state and the chunk's whole
serial chain; split in blocks of 32 it has 128 programs with a quarter of the state each.

    cd benchmarks && PYTHONPATH=../src python3 gdn_split.py [--shape hk16-hv32-d128] [--splits none,64,32,16|none,rule]
        [--warps 4,2,1] [--batches 1,2,4] [--json out.json]

Each block named is forced on every decode call (`SPLIT_BLOCK_V`), whatever its batch; `rule` takes the module's rule.
`--warps 4,2,1` also runs every split setting with the kernel compiled for those warps (the unsplit steps keep the
contract's): a batch-1 step is a chain of small dependent products, whose layout conversions and barriers cost less
over fewer warps. The bits are not expected to survive: compiled for sm_90a, the l2 norms' [16, 128] tile spreads a
row over 16 lanes of 8 elements at 4 warps and over 4 lanes of 4 x 8 at 1 and 2 (another summation order), and the
state update's [128, 16] x [16, BV] product is a wgmma at 4 warps and an mma.sync below (a warpgroup is 4 warps). The
time says whether reductions that no layout reorders (and the contract version they would take) are worth building;
the differing columns say what the kernel as it is gives. On an H100 (docs/experiments.md, "Decode loads, warps, PDL
and short runs") fewer warps were slower (batch 1: 9.18 µs at 4, 10.61 at 2, 15.53 at 1) and, unexpectedly, gave the
same bits.
"""
import argparse
import json

import torch

from gdn import SHAPES, TOKEN_INPUTS, _cache, _contract_op, _decode_chunk, _fla, _inputs
from isoexec.ops.gdn import triton as gdn_triton
from isoexec.runtime.registry import REGISTRY

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def _closing_state(op, x, shape, batch, chunk, width, device, seed: int) -> torch.Tensor:
    """The state a chunk's decode steps leave (the last step closes the chunk and writes it), eager, from a cache drawn
    from `seed`: the steps' outputs do not show the state update's bits, the next chunk's would."""
    state, rows = _cache(shape, batch, chunk, width, device, torch.Generator(device=device).manual_seed(seed))
    ids = torch.arange(batch, device=device)
    with torch.no_grad():
        for i in range(chunk):
            t = {k: (v[i * batch : (i + 1) * batch] if k in TOKEN_INPUTS else v) for k, v in x.items()}
            op(t["q"], t["k"], t["v"], t["a"], t["b"], t["a_log"], t["dt_bias"], state, rows, ids, torch.full((batch,), 2048 + i, device=device))
    return state.view(torch.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--shape", default="hk16-hv32-d128", choices=sorted(SHAPES), help="the GDN head shape (bench.py gdn's names)")
    parser.add_argument("--splits", default="none,64,32,16",
                        help="the blocks of value columns to time (the unsplit steps, `none`, run first whether named or not), "
                             "`rule` triton.SPLITS' choice")
    parser.add_argument("--warps", default="", help="warp counts to run the split steps with too, comma-separated (default: the contract's alone)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="decode batches, comma-separated")
    args = parser.parse_args()
    device = torch.device("cuda")
    op, entry, row_width = _contract_op("tiny-hybrid-triton")
    chunk, contract_warps = entry.constants["chunk_size"], entry.constants["num_warps"]
    impl = REGISTRY.get(entry.impl.id, entry.impl.version)
    ops = {contract_warps: op} | {int(w): impl.bind(dict(entry.constants, num_warps=int(w))) for w in args.warps.split(",") if w}
    fla, why = _fla()
    if fla is None:
        print(f"no flash-linear-attention baseline ({why})")
    shape = SHAPES[args.shape]
    splits = [None if s == "none" else s if s == "rule" else int(s) for s in args.splits.split(",")]
    splits = [None] + [s for s in splits if s is not None]  # the unsplit steps first, always: the bits' base and FLA's time
    rule = gdn_triton.SPLITS
    gdn_triton.SPLITS = ()  # unsplit, or every call of one-token runs split in SPLIT_BLOCK_V, whatever its batch
    rows = []
    for batch in map(int, args.batches.split(",")):
        base = None
        for split, warps in [(split, w) for split in splits for w in ([contract_warps] if split is None else ops)]:
            gdn_triton.SPLIT_BLOCK_V = None if split == "rule" else split
            gdn_triton.SPLITS = rule if split == "rule" else ()
            generator = torch.Generator(device=device).manual_seed(batch)
            row = {"shape": args.shape, "batch": batch, "split_block_v": split, "num_warps": warps, "steps": chunk}
            x = _inputs(shape, batch * chunk, device, generator)
            closed = _closing_state(ops[warps], x, shape, batch, chunk, row_width(*shape[1:]), device, seed=batch)
            outputs = _decode_chunk(ops[warps], fla if split is None else None, x, shape, batch, chunk, row_width(*shape[1:]), device,
                                    generator, row)
            out = outputs["contract"].view(torch.int16)
            if split is None:
                base, base_state = out, closed
                fla_ms = row.get("fla_ms")
            else:
                row["fla_ms"] = fla_ms
            row["differing_vs_unsplit"] = int((out != base).sum())
            row["state_differing_vs_unsplit"] = int((closed != base_state).sum())
            if row.get("fla_ms"):
                row["fla_vs_contract"] = row["contract_ms"] / row["fla_ms"]
            print(f"{args.shape} decode chunk b{batch:<3} split {str(split):>4} warps {warps}: {row['contract_ms'] * 1e3:7.2f} us/step"
                  + (f"  fla {row['fla_ms'] * 1e3:6.2f} us  ratio {row['fla_vs_contract']:.2f}" if row.get("fla_ms") else "")
                  + f"  differing {row['differing_vs_unsplit']}, in the closed state {row['state_differing_vs_unsplit']}", flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
