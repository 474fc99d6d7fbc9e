"""ops/linear/tuning.py: the Hopper rule gives every weight shape a tile the kernels accept, keeps the tiles
the hand tables it replaced listed (the shapes those were timed or admitted at), and fits a model of any shape."""

import pytest

from isoexec.model import PRESETS
from isoexec.ops.linear import tuning
from isoexec.ops.linear.row_parallel_triton import check_constants as check_row_parallel
from isoexec.ops.linear.triton import check_constants as check_linear

BIG = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
NARROW = dict(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4)
WAVES = dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4)
TINY = dict(block_m=64, block_n=32, block_k=32, num_warps=4, num_stages=2)
DECODE = dict(block_m=64, block_n=32, block_k=256, num_warps=4, num_stages=4)
DECODE_64 = {**DECODE, "block_n": 64}
FUSED = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
PERSISTENT = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)

# The tables the rule replaced (tiny-dense, Qwen3-8B, Qwen3-0.6B, Qwen3-30B-A3B's attention, GLM-4.7-Flash).
LISTED = {
    (64, 64): TINY, (32, 64): TINY, (128, 64): TINY, (64, 128): TINY, (512, 64): TINY,
    (4096, 4096): BIG, (1024, 4096): NARROW, (6144, 4096): WAVES, (12288, 4096): BIG, (24576, 4096): BIG,
    (4096, 12288): BIG, (151936, 4096): BIG,
    (2048, 1024): BIG, (1024, 1024): NARROW, (1024, 2048): NARROW, (3072, 1024): BIG, (1024, 3072): NARROW, (151936, 1024): BIG,
    (4096, 2048): BIG, (512, 2048): NARROW, (2048, 4096): BIG, (151936, 2048): BIG,
    (768, 2048): NARROW, (5120, 768): BIG, (576, 2048): NARROW, (10240, 2048): BIG, (1536, 2048): NARROW, (154880, 2048): BIG,
}
LISTED_DECODE = [(2048, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (1024, 3072), (4096, 2048), (512, 2048),
                 (2048, 4096), (768, 2048), (576, 2048), (10240, 2048), (1536, 2048)]
LISTED_ROW_PARALLEL = {(64, 64): TINY, (64, 128): TINY, (4096, 4096): PERSISTENT, (4096, 12288): PERSISTENT, (1024, 2048): FUSED,
                       (1024, 3072): FUSED, (2048, 4096): FUSED, (2048, 5120): FUSED, (2048, 10240): FUSED, (2048, 1536): FUSED}

BF16 = dict(input_dtype="bfloat16", weight_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32")
QWEN3_32B = [(8192, 5120), (1024, 5120), (5120, 8192), (25600, 5120), (5120, 25600), (151936, 5120)]
ODD = [(1, 2048), (33, 4096), (1000, 777), (1537, 4096), (7168, 4096), (12345, 4096), (4096, 12345), (250_000, 8192)]


def test_the_shapes_the_tables_listed_keep_their_tiles():
    for (n, k), tile in LISTED.items():
        assert tuning.hopper_tile(n, k) == tile, (n, k)
    for n, k in LISTED_DECODE:
        assert tuning.hopper_decode_tile(n, k) == DECODE, (n, k)
    for (n, k), tile in LISTED_ROW_PARALLEL.items():
        assert tuning.hopper_row_parallel_tile(n, k) == tile, (n, k)
    # The tiny model's decode keeps its training tile: no entry of its own.
    assert all(tuning.hopper_decode_tile(n, k) is None for (n, k), tile in LISTED.items() if tile is TINY)


@pytest.mark.parametrize("n,k", [*PRESETS["qwen3-8b-random"].projections["gate_proj"], *QWEN3_32B, *ODD])
def test_any_shape_gets_tiles_the_kernels_accept(n, k):
    tile, decode, row_parallel = tuning.hopper_tile(n, k), tuning.hopper_decode_tile(n, k), tuning.hopper_row_parallel_tile(n, k)
    check_linear({**BF16, **tile})
    check_linear({**BF16, **tile, **(decode or {})})
    check_row_parallel({**BF16, **row_parallel, "num_leaves": 8, "leaf_tree": "sequential"})
    assert (decode is None) == (min(n, k) < 256)
    assert tile in (BIG, NARROW, WAVES, TINY) and row_parallel in (PERSISTENT, FUSED, TINY)


def test_the_decode_width_streams_the_fewest_bytes_then_the_fewest_rounds():
    """32 columns a program where they fit the SMs in fewer bytes per SM, 64 where 64 halves the rounds at
    the same bytes (the joined qkv and gate/up and lm_head of Qwen3-8B, as the H200 sweep ranked them)."""
    for n, width in ((1024, 32), (4096, 32), (12288, 32), (6144, 64), (24576, 64), (151936, 64)):
        assert tuning.hopper_decode_tile(n, 4096) == {**DECODE, "block_n": width}, n
    # Over an entry the bytes of every launch add up: one 64-wide launch does not outweigh many at 32.
    assert tuning.hopper_decode_fit({(4096, 1024): 28, (6144, 1024): 28, (151936, 1024): 1}) == DECODE
    assert tuning.hopper_decode_fit({(64, 64): 3}) is None


def test_decode_launches_join_the_siblings_an_entry_holds():
    spec = PRESETS["qwen3-8b-random"]
    dense = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"]
    assert tuning.decode_launches(dense, spec) == {(6144, 4096): 36, (24576, 4096): 36, (151936, 4096): 1}
    # Siblings split between entries run one by one.
    assert tuning.decode_launches(["q_proj", "k_proj", "gate_proj", "up_proj"], spec) == {(4096, 4096): 36, (1024, 4096): 36, (24576, 4096): 36}


def test_qwen3_8b_fits_the_big_tiles_and_the_decode_tile():
    """The 8B preset's shapes were never all listed (no decode tile at all): the rule fits every entry."""
    spec, cases = PRESETS["qwen3-8b-random"], ["trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"]
    dense = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head"]
    assert tuning.fit(dense, cases, spec, "sm_90") == [(cases[:3], BIG), (["engine_decode"], {**BIG, **DECODE_64})]
    assert tuning.fit_row_parallel(["o_proj", "down_proj"], cases, spec, "sm_90") == [(cases[:3], PERSISTENT), (["engine_decode"], {**PERSISTENT, **DECODE})]
    assert tuning.fit(dense, cases, spec, "sm_80") is None and tuning.fit(dense, ["engine_decode"], spec, "sm_90") == [(["engine_decode"], BIG)]
