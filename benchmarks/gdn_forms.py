"""Multiply-adds and bytes of a Gated DeltaNet layer's core (`gdn.core`) per token, in the two designs
that compute every row by one op sequence, beside flash-linear-attention's native pair of forms, at a
model's GDN shape: what decides which design IsoExec runs (docs/gdn.md).

    python3 benchmarks/gdn_forms.py [--heads 16 32] [--dims 128 128] [--chunk 64]

Per chunk of C tokens and value head (Hv heads, key and value widths Dk, Dv; masked pairs skipped):
- chunk rows (IsoExec's reference, §3 of the design brief): the UT system's rows (k_i · k_j, j < i),
  forward substitution for w and u row by row (Σ_{j<i} a_ij [w_j | u_j]: serial over the chunk's rows),
  δ = u - S₀ᵀ w, the output's inter (S₀ᵀ q) and intra (q_i · k_j, then δ_j) parts, and the state update
  at the chunk's end. A decode step is one such row: O(C (Dk + Dv) + Dk Dv), reading S₀ and the open
  chunk's cached rows (k, w, u, δ, c of each);
- scan rows (SkyRL-IsoExec's CPR): the chunk pass for the boundary states only, then every row by the
  recurrent step from its chunk's boundary state, token after token inside a chunk (4 Dk Dv a token, on
  vector units: no matrix product is left in it); a decode step is one recurrent step, and the chunk
  pass runs again over the 64 buffered tokens when a chunk closes;
- native (flash-linear-attention): the chunk form for training and prefill (the UT system inverted by
  blocks, everything else matrix products) and the recurrent step for decode.
Bytes are a decode step's state traffic in fp32 (the rows' own q/k/v/g/β reads are the same in all three).
"""

import argparse


def chunk_terms(c: int, dk: int, dv: int) -> dict:
    below, upto = c * (c - 1) // 2, c * (c + 1) // 2
    return dict(system=below * dk, substitution=below * (dk + dv), delta=c * dk * dv, inter=c * dk * dv, scores=upto * dk,
                intra=upto * dv, state=c * dk * dv, inverse=c * c * c // 6)


def per_token(c: int, dk: int, dv: int) -> dict:
    """name -> (training MACs a token, of which serial-vector MACs, decode MACs a token, decode bytes a token)."""
    t = chunk_terms(c, dk, dv)
    rows = dict(
        train=(t["system"] + t["substitution"] + t["delta"] + t["inter"] + t["scores"] + t["intra"] + t["state"]) / c,
        serial=t["substitution"] / c,
        decode=sum((i * dk + i * (dk + dv) + 2 * dk * dv + (i + 1) * (dk + dv)) for i in range(c)) / c + dk * dv,
        bytes=4 * (dk * dv + sum(i * (2 * dk + 2 * dv + 1) for i in range(c)) / c + (2 * dk + 2 * dv + 1)
                   + (c * (2 * dk + 2 * dv + 1) + 2 * dk * dv) / c),
    )
    chunk_pass = t["system"] + t["inverse"] + (c * c // 2) * (dk + dv) + t["delta"] + t["state"]
    scan = dict(
        train=chunk_pass / c + 4 * dk * dv,
        serial=4 * dk * dv,
        decode=4 * dk * dv + chunk_pass / c,
        bytes=4 * (2 * dk * dv + (dk + dv + 2) + (c * (dk + dv + 2) + 2 * dk * dv) / c),
    )
    native = dict(
        train=(t["system"] + t["inverse"] + (c * c // 2) * (dk + dv) + t["delta"] + t["inter"] + t["scores"] + t["intra"] + t["state"]) / c,
        serial=0.0,
        decode=4 * dk * dv,
        bytes=4 * 2 * dk * dv,
    )
    return {"chunk rows (IsoExec)": rows, "scan rows (SkyRL CPR)": scan, "native (FLA)": native}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, nargs=2, default=(16, 32), metavar=("HK", "HV"), help="key and value heads (Qwen3.5-9B / 35B-A3B: 16 32)")
    parser.add_argument("--dims", type=int, nargs=2, default=(128, 128), metavar=("DK", "DV"), help="key and value head widths")
    parser.add_argument("--chunk", type=int, default=64, help="chunk size C")
    args = parser.parse_args()
    (_, hv), (dk, dv), c = args.heads, args.dims, args.chunk
    table = per_token(c, dk, dv)
    native = table["native (FLA)"]
    print(f"gdn.core per token and layer, Hv {hv}, Dk {dk}, Dv {dv}, C {c} (MACs and fp32 state bytes over all value heads)\n")
    print("| design | training MACs | of them serial, vector | vs native | decode MACs | decode state bytes | vs native |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, row in table.items():
        print(f"| {name} | {hv * row['train'] / 1e6:.2f} M | {hv * row['serial'] / 1e6:.2f} M | {row['train'] / native['train']:.2f} | "
              f"{hv * row['decode'] / 1e6:.2f} M | {hv * row['bytes'] / 2**20:.2f} MiB | {row['bytes'] / native['bytes']:.2f} |")


if __name__ == "__main__":
    main()
