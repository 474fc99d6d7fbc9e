"""RMSNorm kernel constants by device arch and row width, for rms_norm.triton and rms_norm.residual.triton.

Never chosen from the row count. An arch without a table returns None from `fit`: the entry keeps the
contract's portable constants.
"""

# Hopper (H100/H200) constants, keyed by the row width H, not swept. One contract entry (plain or fused)
# covers several norms, so it takes the value for its widest H (`fit` below): the hidden size,
# or the head dim for an entry of q_norm/k_norm alone.
# A chunk of 1024 over 4 warps gives each thread 8 contiguous elements (16-byte bf16 loads). Wider rows
# take one chunk over more warps instead of several chunks walked in turn: on one H200 (graph replays of
# the residual form, benchmarks/results/2026-12-04_6b39078_pdl_sampler/norm_tiles.txt) a 4096-wide row took
# 1.7 us in one 4096-chunk over 8 warps against 3.2 in four 1024-chunks over 4 at batch 1, 1.9 against
# 3.4 at 64 rows, 36 against 46 at 4096 rows; 2048-wide, 1.4 against 2.0 at batch 1.
HOPPER_CONSTANTS = {
    64: dict(reduce_block=64, num_warps=1),  # tiny-dense hidden (and head_dim 16)
    128: dict(reduce_block=128, num_warps=1),  # Qwen3-8B q_norm, k_norm (head_dim 128)
    512: dict(reduce_block=512, num_warps=2),  # GLM-4.7-Flash kv_a_layernorm (not timed)
    768: dict(reduce_block=256, num_warps=2),  # GLM-4.7-Flash q_a_layernorm (not timed)
    1024: dict(reduce_block=1024, num_warps=4),  # Qwen3-0.6B hidden
    2048: dict(reduce_block=2048, num_warps=8),  # Qwen3-30B-A3B hidden
    4096: dict(reduce_block=4096, num_warps=8),  # Qwen3-8B hidden
}

TABLES = {"sm_90": HOPPER_CONSTANTS}


def fit(ops, cases, spec, arch: str):
    """[(cases, constants to set)] for the widest row the entry's ops reduce, or None where `arch` has no table."""
    if arch not in TABLES:
        return None
    width = max(spec.norm_widths.get(op, spec.hidden_size) for op in ops)
    return [(list(cases), TABLES[arch].get(width, {}))]
