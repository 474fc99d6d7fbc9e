"""The Qwen3-Next family (`Qwen3NextForCausalLM`, model_type `qwen3_next`): Qwen3.5's hybrid layers
(`qwen3_5.py`) with Qwen3-MoE's layer rule for the feed-forward (a `moe` with a gated shared expert in
layer i unless i is in `mlp_only_layers` or (i + 1) % `decoder_sparse_step` != 0, where a dense `mlp` of
`intermediate_size` runs), and its Gated DeltaNet projections fused per key head.

`in_proj_qkvz` holds, for each key head g, [q_g (Dk) | k_g (Dk) | v_g (r Dv) | z_g (r Dv)] with r = Hv / Hk,
and `in_proj_ba` [b_g (r) | a_g (r)]: the loader splits them into the layer's `in_proj_qkv` (all q, all k,
all v), `in_proj_z`, `in_proj_b` and `in_proj_a` — a permutation of weight rows, so every projection's
output is the same values in the order the conv and the core read them — and `save` fuses them back.
"""

import torch

from ..spec import GDNSpec, MLPSpec, ModelSpec, MoESpec, SpecError
from . import qwen3_5, qwen3_moe
from .family import Family, config_reader

ARCHITECTURE = "Qwen3NextForCausalLM"


def from_config(config: dict, source: str) -> ModelSpec:
    get = config_reader(config, source)
    step = config.get("decoder_sparse_step", 1)
    mlp_only = config.get("mlp_only_layers") or []
    if not isinstance(step, int) or step < 1:
        raise SpecError(f"{source}: decoder_sparse_step must be a positive int, got {step!r}")
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        raise SpecError(f"{source}: mlp_only_layers must be a list of layer indices, got {mlp_only!r}")
    moe = MoESpec(num_experts=get("num_experts"), top_k=get("num_experts_per_tok"), moe_intermediate_size=get("moe_intermediate_size"),
                  norm_topk_prob=bool(config.get("norm_topk_prob", True)), shared_intermediate_size=get("shared_expert_intermediate_size"),
                  shared_gate=True)
    dense = MLPSpec(intermediate_size=get("intermediate_size"))
    layers = qwen3_5.hybrid_layers(config, source, lambda i: moe if i not in mlp_only and (i + 1) % step == 0 else dense)
    spec = qwen3_5.hybrid_spec(config, source, "qwen3-next", ARCHITECTURE, layers)
    return spec.replace(extra=(("decoder_sparse_step", step), ("mlp_only_layers", tuple(mlp_only)), ("intermediate_size", dense.intermediate_size)))


def to_hf_config(spec: ModelSpec) -> dict:
    extra = dict(spec.extra)
    moe = next(layer.ffn for layer in spec.layers if isinstance(layer.ffn, MoESpec))
    return {"architectures": [ARCHITECTURE], **qwen3_5.hybrid_fields(spec, "qwen3_next"), "intermediate_size": extra["intermediate_size"],
            "num_experts": moe.num_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.moe_intermediate_size,
            "shared_expert_intermediate_size": moe.shared_intermediate_size, "norm_topk_prob": moe.norm_topk_prob,
            "decoder_sparse_step": extra["decoder_sparse_step"], "mlp_only_layers": list(extra["mlp_only_layers"])}


def _gdn(spec: ModelSpec) -> GDNSpec:
    return spec.gdn[0]


def _layer_prefixes(tensors: dict, suffix: str) -> list[str]:
    return sorted(k[: -len(suffix)] for k in tensors if k.endswith(suffix))


def split_projections(tensors: dict, spec: ModelSpec) -> dict:
    """Qwen3-Next's fused in_proj_qkvz / in_proj_ba -> the layer's four projections (row permutations)."""
    out = dict(tensors)
    if not spec.gdn:
        return out
    g = _gdn(spec)
    r = g.num_v_heads // g.num_k_heads
    for prefix in _layer_prefixes(tensors, "in_proj_qkvz.weight"):
        qkvz = out.pop(prefix + "in_proj_qkvz.weight").unflatten(0, (g.num_k_heads, -1))  # [Hk, 2 Dk + 2 r Dv, H]
        q, k, v, z = qkvz.split([g.k_head_dim, g.k_head_dim, r * g.v_head_dim, r * g.v_head_dim], dim=1)
        out[prefix + "in_proj_qkv.weight"] = torch.cat([q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)])
        out[prefix + "in_proj_z.weight"] = z.flatten(0, 1)
        ba = out.pop(prefix + "in_proj_ba.weight").unflatten(0, (g.num_k_heads, -1))  # [Hk, 2 r, H]
        b, a = ba.split([r, r], dim=1)
        out[prefix + "in_proj_b.weight"], out[prefix + "in_proj_a.weight"] = b.flatten(0, 1), a.flatten(0, 1)
    return out


def fuse_projections(tensors: dict, spec: ModelSpec) -> dict:
    """The inverse of `split_projections`, for `save`."""
    out = dict(tensors)
    if not spec.gdn:
        return out
    g = _gdn(spec)
    r = g.num_v_heads // g.num_k_heads
    for prefix in _layer_prefixes(tensors, "in_proj_qkv.weight"):
        qkv = out.pop(prefix + "in_proj_qkv.weight")
        q, k, v = qkv.split([g.key_dim, g.key_dim, g.value_dim])
        z = out.pop(prefix + "in_proj_z.weight")
        per_head = [t.unflatten(0, (g.num_k_heads, -1)) for t in (q, k, v, z)]
        out[prefix + "in_proj_qkvz.weight"] = torch.cat(per_head, dim=1).flatten(0, 1).contiguous()
        b, a = (out.pop(prefix + name).unflatten(0, (g.num_k_heads, r)) for name in ("in_proj_b.weight", "in_proj_a.weight"))
        out[prefix + "in_proj_ba.weight"] = torch.cat([b, a], dim=1).flatten(0, 1).contiguous()
    return out


def adapt(tensors: dict, spec: ModelSpec) -> dict:
    return qwen3_moe.fuse_experts(split_projections(tensors, spec), spec)


def _tiny(**changes) -> ModelSpec:
    config = {**qwen3_5.TINY_CONFIG, "architectures": [ARCHITECTURE], "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 48, "decoder_sparse_step": 1, "mlp_only_layers": [0], **changes}
    return from_config(config, "preset")


FAMILY = Family(
    name="qwen3-next",
    architectures=(ARCHITECTURE,),
    from_config=from_config,
    to_hf_config=to_hf_config,
    ignored_prefixes=lambda spec: ("mtp.",),
    adapt=adapt,
    export=fuse_projections,
    contract="tiny-hybrid",
    presets={
        # tiny-hybrid's layers, the first with a dense MLP, the others six experts of 32, top-2, a gated shared expert.
        "tiny-qwen3-next": _tiny(),
    },
)
