"""Kernel constants of the Triton MoE impls by device arch and MoE layer shape, never chosen from the batch.

`contract.fit_contract` calls these through `Impl.tune`. Keyed by the model's MoE layer shape: experts
(E, I, H) for the grouped GEMMs, (E, H) for the router, H for the combine. An arch without a table returns
None: the entry keeps the contract's portable constants.
"""

from ...model.spec import MoESpec

# Hopper (H100/H200). One tile serves decode (a few rows on each of many experts, where every program
# reads its expert's weight slice once) and training (about T k / E rows an expert).
# Not swept: the bench's `moe` section times these on the 30B-A3B-shaped preset.
_EXPERTS_TINY = dict(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2)
_EXPERTS_BIG = dict(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)
HOPPER_EXPERTS = {
    (6, 32, 64): _EXPERTS_TINY,  # tiny-moe, tiny-mla
    (8, 32, 64): _EXPERTS_TINY,  # tiny-deepseek-v3
    (128, 768, 2048): _EXPERTS_BIG,  # Qwen3-30B-A3B
    (256, 512, 2048): _EXPERTS_BIG,
    (64, 1536, 2048): _EXPERTS_BIG,  # GLM-4.7-Flash (not timed)
}
# The router holds a [block_t, E] fp32 tile of logits and scores through its k top-k rounds: 16 rows keep
# it in registers at 256 experts (32 rows spilled, 3.4x slower there). block_k 64 or 128 and block_t 16 or
# 32 give the same bits; block_t 64 and num_warps 8 do not (profile_gpu.py moe-tiles).
_ROUTER_WIDE = dict(block_t=16, block_k=128, num_warps=4)
HOPPER_ROUTER = {
    (6, 64): dict(block_t=16, block_k=32, num_warps=4),
    (8, 64): dict(block_t=16, block_k=32, num_warps=4),
    (128, 2048): _ROUTER_WIDE,
    (256, 2048): _ROUTER_WIDE,
    (64, 2048): _ROUTER_WIDE,  # GLM-4.7-Flash (not timed)
}
HOPPER_COMBINE = {
    64: dict(block_t=16, block_h=64, num_warps=4),
    2048: dict(block_t=16, block_h=256, num_warps=4),
}

TABLES = {"sm_90": (HOPPER_EXPERTS, HOPPER_ROUTER, HOPPER_COMBINE)}


def _moe_layers(spec) -> list[MoESpec]:
    return [layer.ffn for layer in spec.layers if isinstance(layer.ffn, MoESpec)]


def _fit(which: int, key, ops, cases, spec, arch: str):
    if arch not in TABLES:
        return None
    table = TABLES[arch][which]
    tiles = [table[key(moe, spec.hidden_size)] for moe in _moe_layers(spec) if key(moe, spec.hidden_size) in table]
    return [(list(cases), tiles[0] if tiles else {})]


def fit_experts(ops, cases, spec, arch: str):
    return _fit(0, lambda moe, h: (moe.num_experts, moe.moe_intermediate_size, h), ops, cases, spec, arch)


def fit_router(ops, cases, spec, arch: str):
    return _fit(1, lambda moe, h: (moe.num_experts, h), ops, cases, spec, arch)


def fit_combine(ops, cases, spec, arch: str):
    return _fit(2, lambda moe, h: h, ops, cases, spec, arch)
