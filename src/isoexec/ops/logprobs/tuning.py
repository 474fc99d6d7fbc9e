"""Log-prob kernel constants by device arch and vocabulary size, for logprobs.triton.

Never chosen from the row count. An arch without a table returns None from `fit`: the entry keeps the
contract's portable constants.
"""

# Hopper (H100/H200) constants, keyed by the vocabulary size V, not swept: 4096 over 8 warps gives each
# thread 16 contiguous elements and Qwen3's 151936 38 chunks; on one H200 a [512, 151936] bf16 batch
# took 218 us, against 528 us for torch's fp32 log_softmax of the same logits.
HOPPER_CONSTANTS = {
    512: dict(vocab_block=512, num_warps=4),  # tiny-dense
    151936: dict(vocab_block=4096, num_warps=8),  # Qwen3-8B
}

TABLES = {"sm_90": HOPPER_CONSTANTS}


def fit(ops, cases, spec, arch: str):
    """[(cases, constants to set)] for the model's vocabulary, or None where `arch` has no table."""
    if arch not in TABLES:
        return None
    return [(list(cases), TABLES[arch].get(spec.vocab_size, {}))]
