"""FLOPs and bytes of multi-head latent attention in its two algebraic forms, per layer and step, at a
model's shapes: what decides which one form IsoExec runs in every case (docs/mla.md).

    PYTHONPATH=src python3 benchmarks/mla_forms.py [--model glm-4.7-flash-4l-random]

- decompressed: each cached latent row is expanded by kv_b_proj into every head's k_nope and v
  (H (dn + dv) r multiply-adds a key), then attention over heads of dn + dr (scores) and dv (values);
- absorbed: each query's no-rope part is multiplied into the latent space by the heads' key
  up-projections (H dn r a query), attention runs as one shared KV head of r + dr (scores) and r
  (values), and the latent output goes back out by the value up-projections (H r dv a query).

With the (latent, rope key) cache the issue asks for, a decompressed decode step must expand every
cached key of the sequence again, each step. The rest of the layer (projections, the MoE) is counted
once per token so the attention's share of a step shows.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from isoexec.model import PRESETS, MLASpec, MoESpec  # noqa: E402


def per_layer(spec, mla: MLASpec, queries: int, pairs: int, expanded_keys: int, cached_keys: int) -> dict:
    """Multiply-adds and cache bytes of one layer for `queries` query rows, `pairs` (query, visible key)
    pairs, `expanded_keys` latent rows a decompressed step expands, `cached_keys` rows read from the cache."""
    h, r, dn, dr, dv = mla.num_heads, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    expand = h * (dn + dv) * r
    decompressed = expanded_keys * expand + pairs * h * (dn + dr + dv)
    absorbed = queries * (h * dn * r + h * r * dv) + pairs * h * (r + dr + r)
    row_bytes = (r + dr) * 2  # bf16
    return {"decompressed": decompressed, "absorbed": absorbed, "cache_bytes": cached_keys * row_bytes,
            "kv_b_bytes": h * (dn + dv) * r * 2}


def rest_of_layer(spec, layer) -> int:
    """Multiply-adds per token outside attention: the mixer's projections and the feed-forward."""
    macs = sum(n * k for n, k in layer.mixer.projections(spec.hidden_size).values())
    ffn = layer.ffn
    if isinstance(ffn, MoESpec):
        macs += ffn.num_experts * spec.hidden_size + ffn.top_k * 3 * spec.hidden_size * ffn.moe_intermediate_size
        macs += 3 * spec.hidden_size * (ffn.shared_intermediate_size or 0)
    else:
        macs += 3 * spec.hidden_size * ffn.intermediate_size
    return macs


def rows(spec) -> list[tuple[str, dict, int]]:
    mla = spec.mla[0]
    layer = next(layer for layer in spec.layers if isinstance(layer.ffn, MoESpec))
    out = []
    for seq in (2048, 4096):
        seqs = 16384 // seq
        pairs = seqs * seq * (seq + 1) // 2
        out.append((f"training, {seqs} × {seq} tokens", per_layer(spec, mla, 16384, pairs, 16384, 16384), 16384))
    for context in (0, 8192):
        chunk = 2048
        pairs = chunk * context + chunk * (chunk + 1) // 2
        out.append((f"prefill chunk of {chunk} after {context} cached", per_layer(spec, mla, chunk, pairs, chunk + context, chunk + context), chunk))
    for batch, context in ((1, 2048), (64, 2048), (64, 8192)):
        keys = batch * (context + 1)
        out.append((f"decode, batch {batch} at context {context}", per_layer(spec, mla, batch, keys, keys, keys), batch))
    return [(label, {**m, "rest": rest_of_layer(spec, layer) * tokens}, tokens) for label, m, tokens in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="glm-4.7-flash-4l-random", help="an MLA model preset")
    args = parser.parse_args()
    spec = PRESETS.get(args.model)
    if spec is None or not spec.mla:
        parser.error(f"--model {args.model}: not an MLA preset ({', '.join(n for n, s in PRESETS.items() if s.mla)})")
    mla = spec.mla[0]
    print(f"{args.model}: {mla.num_heads} heads, q/k nope {mla.qk_nope_head_dim} + rope {mla.qk_rope_head_dim}, v {mla.v_head_dim}, "
          f"latent {mla.kv_lora_rank}; one MoE layer; GMAC = 1e9 multiply-adds")
    print(f"cache per token and layer: {(mla.kv_lora_rank + mla.qk_rope_head_dim) * 2} bytes (latent + rope key, bf16); expanded K/V "
          f"would be {mla.num_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim) * 2} bytes")
    print("| step | decompressed attention | absorbed attention | absorbed / decompressed | rest of the layer | layer, absorbed / decompressed | cache read |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, m, _ in rows(spec):
        whole = (m["absorbed"] + m["rest"]) / (m["decompressed"] + m["rest"])
        print(f"| {label} | {m['decompressed'] / 1e9:.2f} GMAC | {m['absorbed'] / 1e9:.2f} GMAC | {m['absorbed'] / m['decompressed']:.2f} | "
              f"{m['rest'] / 1e9:.2f} GMAC | {whole:.2f} | {m['cache_bytes'] / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
