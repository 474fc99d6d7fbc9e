"""Kernel constants of the Triton MoE impls by device arch, from a rule over the MoE layer's shape: experts
(E, I, H) for the grouped GEMMs, (E, H) for the router, H for the combine. Never chosen from the batch.

`contract.fit_contract` calls these through `Impl.tune`. An arch without a rule returns None: the entry
keeps the contract's portable constants.
"""

from ...model.spec import MoESpec

# Hopper (H100/H200). One tile serves decode (a few rows on each of many experts, where every program
# reads its expert's weight slice once) and training (about T k / E rows an expert). The bench's `moe`
# section timed the big tile on the 30B-A3B-shaped preset (not swept); test-sized layers (a width under
# 256, as linear's rule has it) take 16-row tiles no wider than their weights.
_EXPERTS_TINY = dict(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2)
_EXPERTS_BIG = dict(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)
# The router holds a [block_t, E] fp32 tile of logits and scores through its k top-k rounds: 16 rows keep
# it in registers at 256 experts (32 rows spilled, 3.4x slower there). block_k 64 or 128 and block_t 16 or
# 32 give the same bits; block_t 64 and num_warps 8 do not (sweep_tiles.py moe-tiles).
_ROUTER_NARROW = dict(block_t=16, block_k=32, num_warps=4)
_ROUTER_WIDE = dict(block_t=16, block_k=128, num_warps=4)
# The combine's columns: up to 256 a program (a 2048-wide hidden state in 8 programs a row block).
_COMBINE_MAX_COLUMNS = 256


def _is_tiny(*dims: int) -> bool:
    return min(dims) < 256


def hopper_experts(num_experts: int, inter: int, hidden: int) -> dict:
    """The grouped GEMMs' tile (gate_up [E, 2I, H] and down [E, H, I]) on Hopper."""
    return _EXPERTS_TINY if _is_tiny(inter, hidden) else _EXPERTS_BIG


def hopper_router(num_experts: int, hidden: int) -> dict:
    """The router's tile on Hopper: its K blocks over the hidden size."""
    return _ROUTER_NARROW if _is_tiny(hidden) else _ROUTER_WIDE


def hopper_combine(hidden: int) -> dict:
    """The combine's tile on Hopper: one block of the hidden size up to 256 columns."""
    return dict(block_t=16, block_h=min(_COMBINE_MAX_COLUMNS, max(16, 1 << (hidden - 1).bit_length())), num_warps=4)


RULES = {"sm_90": (hopper_experts, hopper_router, hopper_combine)}


def _fit(which: int, key, ops, cases, spec, arch: str):
    if arch not in RULES:
        return None
    tiles = [RULES[arch][which](*key(layer.ffn, spec.hidden_size)) for layer in spec.layers if isinstance(layer.ffn, MoESpec)]
    return [(list(cases), tiles[0] if tiles else {})]


def fit_experts(ops, cases, spec, arch: str):
    return _fit(0, lambda moe, h: (moe.num_experts, moe.moe_intermediate_size, h), ops, cases, spec, arch)


def fit_router(ops, cases, spec, arch: str):
    return _fit(1, lambda moe, h: (moe.num_experts, h), ops, cases, spec, arch)


def fit_combine(ops, cases, spec, arch: str):
    return _fit(2, lambda moe, h: (h,), ops, cases, spec, arch)
