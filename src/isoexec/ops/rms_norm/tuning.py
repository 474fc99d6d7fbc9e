"""RMSNorm kernel constants by device arch, from a rule over the row width, for rms_norm.triton and
rms_norm.residual.triton.

Never chosen from the row count. An arch without a rule returns None from `fit`: the entry keeps the
contract's portable constants.
"""

# Hopper (H100/H200). One contract entry (plain or fused) covers several norms, so it takes the constants of
# its widest row H (`fit` below): the hidden size, or the head dim for an entry of q_norm/k_norm alone.
# A row is walked in chunks of `reduce_block`: the widest power of two up to 4096 that cuts it into whole
# chunks (768 -> 256; rows under 64 wide take the portable 64), over a warp per 256 elements of the row
# (1 to 8, a power of two). Wider rows take one chunk over more warps rather than several chunks in turn:
# on one H200 (graph replays of the residual form, benchmarks/results/2026-12-04_6b39078_pdl_sampler/norm_tiles.txt)
# a 4096-wide row took 1.7 us in one 4096-chunk over 8 warps against 3.2 in four 1024-chunks over 4 at
# batch 1, 1.9 against 3.4 at 64 rows, 36 against 46 at 4096 rows; 2048-wide, 1.4 against 2.0 at batch 1.
_MAX_BLOCK = 4096


def hopper_constants(width: int) -> dict:
    """rms_norm.triton's chunk and warps for rows of `width` on Hopper."""
    whole = width & -width  # the largest power of two dividing the width
    warps = max(1, min(8, 1 << ((width // 256).bit_length() - 1))) if width >= 256 else 1
    return dict(reduce_block=min(_MAX_BLOCK, max(64, whole)), num_warps=warps)


RULES = {"sm_90": hopper_constants}


def fit(ops, cases, spec, arch: str):
    """[(cases, constants to set)] for the widest row the entry's ops reduce, or None where `arch` has no rule."""
    if arch not in RULES:
        return None
    width = max(spec.norm_widths.get(op, spec.hidden_size) for op in ops)
    return [(list(cases), RULES[arch](width))]
