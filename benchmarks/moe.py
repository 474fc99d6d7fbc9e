"""bench.py moe: one MoE layer (router + experts + combine) under the contract's Triton impls vs native and
vs a grouped-GEMM baseline, at two MoE layer shapes on a GPU: Qwen3-30B-A3B's (hidden 2048, 128 experts,
top-8, moe_intermediate 768) and a wider, thinner one (hidden 2048, 256 experts, top-8, moe_intermediate
512: half the rows an expert, each GEMM narrower), each with the tiles the Hopper tables list for it.

- `contract`: moe.router.triton, moe.experts.triton, moe.combine.triton with the constants the Hopper
  tables give that shape (what `fit_contract` pins on an H200).
- `native`: moe.*.native, transformers' eager path (F.linear gate, softmax, torch.topk, one GEMM pair per
  expert, index_add_); its per-expert loop reads the routing on the host.
- `grouped_mm`: the fastest non-invariant layer we have (`contracts/fast-baseline.toml`'s): native's router,
  transformers 5's default experts (`moe.experts.grouped_mm`: the routed rows sorted by expert,
  `torch._grouped_mm` for gate_up and down, offsets from a histogram) and a weighted sum over the slots
  (skipped where torch lacks `_grouped_mm`).

Decode batches (T = 1, 16, 64 tokens) time the forward as a CUDA-graph replay where the impl can be
captured (contract, grouped_mm: as decode graphs run; native reads the routing on the host) and eagerly (all three, host launches included).
Training shapes (T = 4096, 16384) time forward alone (trainer_score, prefill) and forward + backward
(trainer_fwd), eagerly. Ratios: `contract_vs_<b>` = b's time / the contract's (above 1: the contract is faster).
Each impl's max |output - native's| is kept, over the tokens it routed to native's experts, with the count
of tokens it routed elsewhere (the contract's gate logits are fp32, native's bf16: near-ties at the k-th
expert can fall either way), so a wrong kernel cannot pass as a fast one.
"""

import dataclasses

import torch

from isoexec.ops.moe import experts_triton, native, tuning
from isoexec.ops.moe import triton as moe_triton
from timing import graphed_ms, kernel_ms

QWEN3_30B_A3B = dict(hidden=2048, experts=128, top_k=8, inter=768)
WIDE_256 = dict(hidden=2048, experts=256, top_k=8, inter=512)
GPU_SHAPES = (QWEN3_30B_A3B, WIDE_256)
TINY = dict(hidden=64, experts=6, top_k=2, inter=32)
DECODE, TRAINING = (1, 16, 64), (4096, 16384)
BOUNDARY = dict(input_dtype="bfloat16", weight_dtype="bfloat16", accum_dtype="float32")


@dataclasses.dataclass
class Layer:
    gate: torch.Tensor  # [E, H]
    gate_up: torch.Tensor  # [E, 2I, H]
    down: torch.Tensor  # [E, H, I]
    top_k: int


def contract_layer(shape: dict):
    key_e = (shape["experts"], shape["inter"], shape["hidden"])
    experts_tile = tuning.hopper_experts(*key_e)
    router_tile = tuning.hopper_router(shape["experts"], shape["hidden"])
    combine_tile = tuning.hopper_combine(shape["hidden"])

    def layer(x, p: Layer):
        weights, ids = moe_triton.router(x, p.gate, None, p.top_k, **BOUNDARY, **router_tile)
        routed = experts_triton.experts(x, ids, p.gate_up, p.down, **BOUNDARY, output_dtype="bfloat16", compute_dtype="float32", **experts_tile)
        return moe_triton.combine(routed, weights, ids, input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32", **combine_tile)

    return layer


def native_layer(x, p: Layer):
    weights, ids = native.router(x, p.gate, None, p.top_k, **BOUNDARY)
    routed = native.experts(x, ids, p.gate_up, p.down, **BOUNDARY, output_dtype="bfloat16", compute_dtype="bfloat16")
    return native.combine(routed, weights, ids, input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32")


def grouped_mm_layer(x, p: Layer):
    weights, ids = native.router(x, p.gate, None, p.top_k, **BOUNDARY)
    routed = native.experts_grouped_mm(x, ids, p.gate_up, p.down, **BOUNDARY, output_dtype="bfloat16", compute_dtype="bfloat16")
    return (routed * weights[..., None].to(routed.dtype)).sum(1)  # [T, H]


def native_routing(x, p: Layer):
    return native.router(x, p.gate, None, p.top_k, **BOUNDARY)[1]


def contract_routing(shape: dict):
    tile = tuning.hopper_router(shape["experts"], shape["hidden"])
    return lambda x, p: moe_triton.router(x, p.gate, None, p.top_k, **BOUNDARY, **tile)[1]


def _impls(shape: dict, device: torch.device) -> dict:
    """name -> (layer, its routing: x, Layer -> ids [T, k])."""
    impls = {"native": (native_layer, native_routing)}
    if device.type == "cuda":
        impls = {"contract": (contract_layer(shape), contract_routing(shape)), **impls}
    else:
        print("moe: the Triton impls are skipped (no CUDA device; the interpreter is far too slow to time)")
    if hasattr(torch, "_grouped_mm"):
        impls["grouped_mm"] = (grouped_mm_layer, native_routing)
    return impls


def _params(shape: dict, device: torch.device, generator: torch.Generator) -> Layer:
    h, e, i = shape["hidden"], shape["experts"], shape["inter"]

    def randn(*s, scale):
        return (torch.randn(*s, generator=generator, device=device) * scale).bfloat16()

    return Layer(randn(e, h, scale=h**-0.5), randn(e, 2 * i, h, scale=h**-0.5), randn(e, h, i, scale=i**-0.5), shape["top_k"])


def _ratios(row: dict, names: list[str], suffix: str) -> None:
    if f"contract_{suffix}" not in row:
        return
    for other in names:
        if other != "contract" and f"{other}_{suffix}" in row:
            row[f"contract_vs_{other}_{suffix.removesuffix('_ms')}"] = row[f"{other}_{suffix}"] / row[f"contract_{suffix}"]


def bench_moe(device: torch.device, shapes=GPU_SHAPES, decode=DECODE, training=TRAINING) -> list[dict]:
    return [row for shape in shapes for row in bench_moe_shape(device, shape, decode, training)]


def bench_moe_shape(device: torch.device, shape: dict, decode, training) -> list[dict]:
    generator = torch.Generator(device=device).manual_seed(0)
    p = _params(shape, device, generator)
    impls = _impls(shape, device)
    names = list(impls)
    rows = []
    for tokens in (*decode, *training):
        x = torch.randn(tokens, shape["hidden"], generator=generator, device=device).bfloat16()
        row = {"tokens": tokens, **shape, "phase": "decode" if tokens in decode else "training"}
        with torch.no_grad():
            want, want_experts = native_layer(x, p).float(), native_routing(x, p).sort(-1).values
            for name, (fn, routing) in impls.items():
                same = (routing(x, p).sort(-1).values == want_experts).all(-1)  # [T]
                row[f"{name}_routed_elsewhere_tokens"] = int((~same).sum())
                row[f"{name}_max_abs_diff_vs_native"] = float((fn(x, p).float() - want)[same].abs().max())
                row[f"{name}_eager_ms"] = kernel_ms(lambda: fn(x, p), device)
                if tokens in decode and name != "native":  # native reads the routing on the host: it cannot be captured
                    try:
                        row[f"{name}_graph_ms"] = graphed_ms(lambda: fn(x, p), device)
                    except RuntimeError as error:
                        row[f"{name}_graph_error"] = str(error).splitlines()[0]
        if tokens in training:
            leaves = [x.clone().requires_grad_(), *(t.clone().requires_grad_() for t in (p.gate, p.gate_up, p.down))]
            q = Layer(*leaves[1:], p.top_k)
            g = torch.randn_like(x)
            for name, (fn, _) in impls.items():
                def step():
                    fn(leaves[0], q).backward(g)
                    for t in leaves:
                        t.grad = None
                try:
                    row[f"{name}_fwd_bwd_ms"] = kernel_ms(step, device)
                except (RuntimeError, NotImplementedError) as error:  # out of memory; an op without a backward here
                    row[f"{name}_fwd_bwd_error"] = str(error).splitlines()[0]
            del leaves, q
        for suffix in ("eager_ms", "graph_ms", "fwd_bwd_ms"):
            _ratios(row, names, suffix)
        print(f"moe E={shape['experts']} I={shape['inter']} T={tokens:>5}  " + "  ".join(f"{k.removesuffix('_ms')} {v:.3f} ms" for k, v in row.items() if k.endswith("_ms"))
              + "".join(f"  {k} {v:.2f}" for k, v in row.items() if "_vs_" in k and "diff" not in k), flush=True)
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
