"""Log-prob kernel constants by device arch, from a rule over the vocabulary size, for logprobs.triton.

Never chosen from the row count. An arch without a rule returns None from `fit`: the entry keeps the
contract's portable constants.
"""

# Hopper (H100/H200), not swept: chunks of up to 4096 over 8 warps give each thread 16 contiguous elements
# (Qwen3's 151936 in 38 chunks); on one H200 a [512, 151936] bf16 batch took 218 us, against 528 us for
# torch's fp32 log_softmax of the same logits. A smaller vocabulary takes one chunk of its padded size,
# no smaller than the portable 512, over 4 warps.
_MAX_BLOCK = 4096


def hopper_constants(vocab_size: int) -> dict:
    """logprobs.triton's chunk and warps for a vocabulary on Hopper."""
    block = min(_MAX_BLOCK, max(512, 1 << (vocab_size - 1).bit_length()))
    return dict(vocab_block=block, num_warps=8 if block == _MAX_BLOCK else 4)


RULES = {"sm_90": hopper_constants}


def fit(ops, cases, spec, arch: str):
    """[(cases, constants to set)] for the model's vocabulary, or None where `arch` has no rule."""
    if arch not in RULES:
        return None
    return [(list(cases), RULES[arch](spec.vocab_size))]
