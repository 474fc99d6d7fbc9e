"""Kernel constants of mla.triton by device arch, from a rule over the MLA shape (H, dn, dr, r, dv); never
chosen from the batch.

`contract.fit_contract` calls `fit` through `Impl.tune`. An arch without a rule keeps the contract's portable
constants (None).
"""

# Hopper (H100/H200), timed at GLM-4.7-Flash's shape (r = 512) on an H200 against the other tiles that compile
# (`sweep_tiles.py mla-tiles`; docs/mla.md has the figures): the fastest in training and prefill; in decode
# 12% behind the best, 4 warps with two value chunks, which is 1.7x slower in training.
# 64-row tiles (one wgmma M) with 8 warps split the [64, r] fp32 accumulator over two warpgroups, 128
# registers a thread at r = 512; 32-key blocks keep the key loop without spills (the masked last blocks spill a
# little). The GEMM tile serves the absorb ([T, dn] x [dn, r] per head) and the way back ([T, r] x [r, dv]).
_WIDE = dict(block_m=64, block_n=32, block_k=64, gemm_block_m=64, gemm_block_n=128, gemm_num_warps=4, value_split=1, num_warps=8,
             num_stages=2)
# Test-sized latents (tiny-mla's r = 32): 16-row tiles.
_TINY = dict(block_m=16, block_n=16, block_k=16, gemm_block_m=16, gemm_block_n=32, gemm_num_warps=4, value_split=1, num_warps=4,
             num_stages=2)
# The widest latent one program's accumulator holds (128 fp32 registers a thread at 8 warps); a wider one
# walks its value columns in chunks of this many (`value_split`).
_MAX_COLUMNS = 512


def hopper_tile(num_heads: int, nope_dim: int, rope_dim: int, rank: int, v_dim: int) -> dict:
    """mla.triton's constants for an MLA shape on Hopper."""
    if rank < 256:
        return _TINY
    padded = 1 << (rank - 1).bit_length()  # the kernel's tile width for the latent (a power of two)
    return {**_WIDE, "value_split": max(1, padded // _MAX_COLUMNS)}


RULES = {"sm_90": hopper_tile}


def fit(ops, cases, spec, arch: str):
    """[(cases, constants to set)] for the model's MLA shape on `arch`, or None where `arch` has no rule."""
    if arch not in RULES:
        return None
    shapes = [(m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim) for m in spec.mla]
    return [(list(cases), RULES[arch](*shapes[0]) if shapes else {})]
