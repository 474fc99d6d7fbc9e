"""The two designs that compute every Gated DeltaNet row by one op sequence (docs/gdn.md, "Why chunk-form rows"),
timed on a GPU rather than counted (gdn_forms.py counts them). Scan rows compute each chunk's rows by the recurrent
step from the chunk's boundary state, in training too: its in-chunk part is flash-linear-attention's recurrent
kernel run over every chunk as a sequence of its own, from a state of its own (`cu_seqlens` at the chunk
boundaries, one initial state per chunk), which this script times at chunks of 16 and 64. That is a lower bound of
the design's training forward (the boundary states' chunk pass comes on top), beside the contract's forward
(chunk-form rows, `gdn.core` of tiny-hybrid-triton) and FLA's own chunk forward, in one run. A decode step of scan
rows is FLA's recurrent step (bench.py gdn's FLA decode column) plus the chunk pass once a chunk.

    cd benchmarks && PYTHONPATH=../src:/tmp/site python3 gdn_designs.py [--json FILE]

Needs a CUDA device and fla-core (carried as a wheel: gpu_checks.sh's gdn-bench). Timings only: the scan's initial
states are random, so no output is compared."""

import argparse
import json

import torch

from gdn import GPU, SHAPES, _contract_op, _fla, _fla_chunk, _inputs
from timing import device_name, kernel_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="head shapes, comma-separated")
    args = parser.parse_args()
    device = torch.device("cuda")
    fla, why = _fla()
    if fla is None:
        raise SystemExit(f"gdn_designs: needs flash-linear-attention ({why})")
    chunk_fn, recurrent = fla
    op, _, _ = _contract_op(GPU["contract"])
    generator = torch.Generator(device=device).manual_seed(0)
    rows = []
    for shape_name in args.shapes.split(","):
        hk, hv, dk, dv = SHAPES[shape_name]
        for seqs, seq_len in GPU["training"]:
            tokens = seqs * seq_len
            x = _inputs(SHAPES[shape_name], tokens, device, generator)
            positions = torch.arange(seq_len, device=device).repeat(seqs)
            cu = torch.arange(seqs + 1, device=device) * seq_len
            row = {"shape": shape_name, "seqs": seqs, "seq_len": seq_len}
            with torch.no_grad():
                row["contract_ms"] = kernel_ms(lambda: op(x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"],
                                                          positions=positions), device)
                row["fla_chunk_ms"] = kernel_ms(lambda: _fla_chunk(fla, x, cu), device)
                for name, bounds, states in [("fla_recurrent_whole_ms", cu, None)] + [
                        (f"scan_rows_c{c}_ms", torch.arange(0, tokens + 1, c, device=device),
                         torch.randn(tokens // c, hv, dk, dv, generator=generator, device=device) * 0.1) for c in (16, 64)]:
                    row[name] = kernel_ms(lambda: recurrent(
                        x["q"][None], x["k"][None], x["v"][None], x["a"][None], beta=x["b"][None], initial_state=states,
                        output_final_state=False, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["a_log"],
                        dt_bias=x["dt_bias"], use_beta_sigmoid_in_kernel=True, cu_seqlens=bounds), device)
            print(f"gdn designs {shape_name} {seqs} x {seq_len}: " + "  ".join(f"{k.removesuffix('_ms')} {v:.3f} ms"
                                                                           for k, v in row.items() if k.endswith("_ms")), flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name(device), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
