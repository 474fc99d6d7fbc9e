"""Decode steps of gdn.core.triton with the value columns split over the grid (`SPLITS`, ops/gdn/triton.py)
against the contract's one block a program, beside flash-linear-attention's recurrent step: the time per step over a
whole chunk (16 steps from a chunk's first offset, one CUDA graph, as `bench.py gdn` times "decode chunk"), and the
elements whose bits differ from the unsplit steps' (they must be none).

A batch-1 step has 32 programs at Qwen3.5-9B's heads, each with a 128 x 128 fp32 state and the chunk's whole
serial chain; split in blocks of 32 it has 128 programs with a quarter of the state each.

    cd benchmarks && PYTHONPATH=../src python3 gdn_split.py [--shape hk16-hv32-d128] [--splits none,64,32,16|none,rule] [--json out.json]

Each block named is forced on every decode call (`SPLIT_BLOCK_V`), whatever its batch; `rule` takes the module's rule.
"""
import argparse
import json

import torch

from gdn import SHAPES, _contract_op, _decode_chunk, _fla, _inputs
from isoexec.ops.gdn import triton as gdn_triton

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--shape", default="hk16-hv32-d128", choices=sorted(SHAPES), help="the GDN head shape (bench.py gdn's names)")
    parser.add_argument("--splits", default="none,64,32,16",
                        help="the blocks of value columns to time, `none` the unsplit steps first, `rule` triton.SPLITS' choice")
    args = parser.parse_args()
    device = torch.device("cuda")
    op, entry, row_width = _contract_op("tiny-hybrid-triton")
    chunk = entry.constants["chunk_size"]
    fla, why = _fla()
    if fla is None:
        print(f"no flash-linear-attention baseline ({why})")
    shape = SHAPES[args.shape]
    splits = [None if s == "none" else s if s == "rule" else int(s) for s in args.splits.split(",")]
    rule = gdn_triton.SPLITS
    gdn_triton.SPLITS = ()  # unsplit, or every call of one-token runs split in SPLIT_BLOCK_V, whatever its batch
    rows = []
    for batch in BATCHES:
        base = None
        for split in splits:
            gdn_triton.SPLIT_BLOCK_V = None if split == "rule" else split
            gdn_triton.SPLITS = rule if split == "rule" else ()
            generator = torch.Generator(device=device).manual_seed(batch)
            row = {"shape": args.shape, "batch": batch, "split_block_v": split, "steps": chunk}
            outputs = _decode_chunk(op, fla if split is None else None, _inputs(shape, batch * chunk, device, generator), shape, batch,
                                    chunk, row_width(*shape[1:]), device, generator, row)
            out = outputs["contract"].view(torch.int16)
            if split is None:
                base = out
                fla_ms = row.get("fla_ms")
            else:
                row["fla_ms"] = fla_ms
            row["differing_vs_unsplit"] = int((out != base).sum())
            if row.get("fla_ms"):
                row["fla_vs_contract"] = row["contract_ms"] / row["fla_ms"]
            print(f"{args.shape} decode chunk b{batch:<3} split {str(split):>4}: {row['contract_ms'] * 1e3:7.2f} us/step"
                  + (f"  fla {row['fla_ms'] * 1e3:6.2f} us  ratio {row['fla_vs_contract']:.2f}" if row.get("fla_ms") else "")
                  + f"  differing {row['differing_vs_unsplit']}", flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
