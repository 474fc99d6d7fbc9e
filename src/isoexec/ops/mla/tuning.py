"""Kernel constants of mla.triton by device arch and MLA shape (H, dn, dr, r, dv), never chosen from the batch.

`contract.fit_contract` calls `fit` through `Impl.tune`. An arch without a table, or a shape it does not
list, keeps the contract's portable constants (None, or no changes).
"""

# Hopper (H100/H200), timed on an H200 against the other tiles that compile (`profile_gpu.py mla-tiles`;
# docs/mla.md has the figures): the fastest in training and prefill; in decode 12% behind the best, 4 warps
# with two value chunks, which is 1.7x slower in training.
# 64-row tiles (one wgmma M) with 8 warps split the [64, 512] fp32 accumulator over two warpgroups, 128
# registers a thread; 32-key blocks keep the key loop without spills (the masked last blocks spill a
# little). The GEMM tile serves the absorb ([T, 192] x [192, 512] per head) and the way back ([T, 512] x
# [512, 256]).
_GLM = dict(block_m=64, block_n=32, block_k=64, gemm_block_m=64, gemm_block_n=128, gemm_num_warps=4, value_split=1, num_warps=8,
            num_stages=2)
_TINY = dict(block_m=16, block_n=16, block_k=16, gemm_block_m=16, gemm_block_n=32, gemm_num_warps=4, value_split=1, num_warps=4,
             num_stages=2)
HOPPER = {
    (4, 16, 8, 32, 16): _TINY,  # tiny-mla, tiny-deepseek-v3
    (20, 192, 64, 512, 256): _GLM,  # GLM-4.7-Flash
}
TABLES = {"sm_90": HOPPER}


def fit(ops, cases, spec, arch: str):
    """[(cases, constants to set)] for the model's MLA shape on `arch`, or None where `arch` has no table."""
    if arch not in TABLES:
        return None
    shapes = [(m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim) for m in spec.mla]
    listed = [TABLES[arch][shape] for shape in shapes if shape in TABLES[arch]]
    return [(list(cases), listed[0] if listed else {})]
