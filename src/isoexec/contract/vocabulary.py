"""The closed vocabularies a contract is written in: cases, regions, dtypes, proofs, constants.

Every name here is spelled the same in code, contract files, docs and metrics. Adding a region or a
typed constant is a one-line change here; unknown names in a contract are errors, so a typo never
silently produces a contract that pins nothing.
"""

SCHEMA_VERSION = 1

ROLES = ("trainer", "engine")
GRAD_MODES = ("autograd", "no_grad")
STATE_KINDS = ("kv_cache", "recurrent_state")

# Every contract defines at least these four cases (docs/contract.md); it may define more.
REQUIRED_CASES = ("trainer_fwd", "trainer_score", "engine_prefill", "engine_decode")

# region -> the roles whose cases must all be covered once the region appears in a contract.
REGIONS = {
    "embedding": ROLES,
    "linear": ROLES,
    "linear.row_parallel": ROLES,
    "rms_norm": ROLES,
    "rms_norm.residual": ROLES,
    "rms_norm.gated": ROLES,
    "rope": ROLES,
    "attention": ROLES,
    "activation": ROLES,
    "activation.gate": ROLES,
    "residual": ROLES,
    "logprobs": ROLES,
    "sampling": ("engine",),
    "moe.router": ROLES,
    "moe.experts": ROLES,
    "moe.combine": ROLES,
    "mla": ROLES,
    "gdn.conv": ROLES,
    "gdn.core": ROLES,
}


def register_region(region: str, roles: tuple[str, ...] = ROLES) -> None:
    """Add a region for an op family defined outside this package (its impls and probe register with
    the runtime registry); `roles` are the roles whose cases must all pin it once a contract does."""
    if region in REGIONS:
        raise ValueError(f"region {region!r} is already defined")
    if not roles or any(role not in ROLES for role in roles):
        raise ValueError(f"region {region!r}: roles must be a non-empty subset of {', '.join(ROLES)}, got {roles!r}")
    REGIONS[region] = tuple(roles)

DTYPES = ("float64", "float32", "bfloat16", "float16")

DISCHARGE_METHODS = ("bitwise_equal_to", "proof", "none")

# Named proofs: ops whose output bits are a selection or rearrangement of input bits, so every case
# computes the same bits without a validation run.
PROOFS = {
    "exact_gather": "output rows are copies of table rows selected by index",
    "exact_copy": "output is a bit copy of the input",
    "exact_concat": "output is a concatenation of input bit patterns",
}

TREE_SHAPES = ("balanced_binary", "sequential")

# Quantities a contract may claim a tolerance for; "0" means bitwise equal.
TOLERANCE_QUANTITIES = ("logprobs", "full_vocab_logprobs")

# Constants with a fixed meaning and type. Constants not listed here are impl-specific: they may be
# ints, bools, strings or lists of those (never raw floats); the registry checks them per impl.
DTYPE_CONSTANTS = (
    "accum_dtype",
    "input_dtype",
    "output_dtype",
    "weight_dtype",
    "kv_cache_dtype",
    "table_dtype",
    "compute_dtype",
)
POSITIVE_INT_CONSTANTS = (
    "block_m",
    "block_n",
    "block_k",
    "block_d",
    "reduce_block",
    "vocab_block",
    "chunk_size",
)
NON_NEGATIVE_INT_CONSTANTS = ("split_kv_size",)
POWER_OF_TWO_CONSTANTS = ("num_leaves",)
TREE_CONSTANTS = ("tree", "leaf_tree", "block_tree")
REAL_CONSTANTS = ("eps",)
# The dtype constants at an op's boundary (what it reads and writes), as opposed to its internal
# accumulation: fitting a contract to a model sets them to the model's dtype, and the admission
# battery's dtype passes vary them together.
BOUNDARY_CONSTANTS = ("input_dtype", "output_dtype", "weight_dtype", "kv_cache_dtype")
