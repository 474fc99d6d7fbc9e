"""GEMM tiles by device arch and weight shape (N, K), for linear.triton and linear.row_parallel.triton.

`fit` is how `contract.fit_contract` tunes an entry of either impl to a model: the tile listed for the
shapes doing most of the entry's work (weight elements over all layers; lm_head counts once), never
chosen from M. Where a decode tile is listed too, engine_decode gets an entry of its own with it (the
battery must then show decode rows bitwise equal to the other cases' rows). An arch without a table
returns None: the entry keeps the contract's portable constants.
"""

# Hopper (H100/H200) tiles for bf16 boundaries, keyed by (N, K) of the weight. On one H200 (triton 3.6,
# benchmarks/sweep_gemm.py) no tile changed a bit of the output, BLOCK_K included, so these are speed
# choices; the battery still proves each on its device. One tile serves every M, so it is the fastest
# at M = 1024 and 4096 (the trainer's and prefill's sizes): 128x256x64 reached 0.93-1.06x cuBLAS with the
# persistent launch at Qwen3-8B shapes. N = 1024 layers have too few 128x256 tiles to fill the GPU at
# M = 1024 and take 64x256. Decode batches get tiles of their own below.
_BIG = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
_NARROW = dict(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4)
# N = 6144 at K = 4096 (Qwen3-8B's q, k and v as one GEMM): 192 tiles of 128x256 make 1.45 waves on 132 SMs
# at M = 1024 (0.76x cuBLAS); 128x128 reached 0.88x there and 0.90x at M = 4096 (128x256: 0.97x).
_WAVES = dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4)
_TINY = dict(block_m=64, block_n=32, block_k=32, num_warps=4, num_stages=2)  # not timed
HOPPER_CONSTANTS = {
    # tiny-dense: hidden 64, intermediate 128, 4 heads / 2 KV heads of 16, vocab 512
    (64, 64): _TINY,  # q_proj, o_proj
    (32, 64): _TINY,  # k_proj, v_proj
    (128, 64): _TINY,  # gate_proj, up_proj
    (64, 128): _TINY,  # down_proj
    (512, 64): _TINY,  # lm_head
    # Qwen3-8B: hidden 4096, intermediate 12288, 32 heads / 8 KV heads of 128, vocab 151936
    (4096, 4096): _BIG,  # q_proj, o_proj
    (1024, 4096): _NARROW,  # k_proj, v_proj
    (6144, 4096): _WAVES,  # fused qkv_proj
    (12288, 4096): _BIG,  # gate_proj, up_proj
    (24576, 4096): _BIG,  # fused gate_up_proj (not timed)
    (4096, 12288): _BIG,  # down_proj
    (151936, 4096): _BIG,  # lm_head
    # Qwen3-0.6B (timed at decode sizes only): hidden 1024, intermediate 3072, 16 heads / 8 KV heads of 128
    (2048, 1024): _BIG,  # q_proj
    (1024, 1024): _NARROW,  # k_proj, v_proj
    (1024, 2048): _NARROW,  # o_proj
    (3072, 1024): _BIG,  # gate_proj, up_proj
    (1024, 3072): _NARROW,  # down_proj
    (151936, 1024): _BIG,  # lm_head
    # Qwen3-30B-A3B's attention half (not timed; as the shapes above): hidden 2048, 32 heads / 4 KV heads of 128
    (4096, 2048): _BIG,  # q_proj
    (512, 2048): _NARROW,  # k_proj, v_proj
    (2048, 4096): _BIG,  # o_proj
    (151936, 2048): _BIG,  # lm_head
    # GLM-4.7-Flash (not timed; as the shapes above): hidden 2048, 20 heads, q_lora_rank 768, kv_lora_rank 512
    # + rope 64, nope 192 + rope 64 and v 256 a head, dense intermediate 10240, shared expert 1536, vocab 154880
    (768, 2048): _NARROW,  # q_a_proj
    (5120, 768): _BIG,  # q_b_proj
    (576, 2048): _NARROW,  # kv_a_proj_with_mqa
    (10240, 2048): _BIG,  # gate_proj, up_proj of the dense layer
    (1536, 2048): _NARROW,  # the shared expert's gate_proj, up_proj
    (154880, 2048): _BIG,  # lm_head
}


# Tiles for engine_decode alone (a batch of at most max_num_seqs rows), keyed by (N, K). `fit`
# gives them to a decode entry of their own, and the battery must show decode rows bitwise equal to the
# other cases' rows. `benchmarks/profile_gpu.py gemm` times candidates as CUDA-graph replays (as decode
# runs) at M = 1, 16 and 64 on one H200; none of 48 per shape changed a bit. 64x32x256 (4 warps, 4
# stages) was the fastest or within 4% of it in the sum over M at every layer shape, level with cuBLAS
# for q_proj and gate/up and faster for k/v; one row tile holds the whole batch, so each weight tile is
# read once. The 16x32x128 tile it replaces re-read weights for every 16 rows: 1.15-1.7x slower at M = 64.
_DECODE = dict(block_m=64, block_n=32, block_k=256, num_warps=4, num_stages=4)
HOPPER_DECODE_CONSTANTS: dict[tuple[int, int], dict] = {
    (2048, 1024): _DECODE,  # Qwen3-0.6B q_proj
    (1024, 1024): _DECODE,  # k_proj, v_proj
    (1024, 2048): _DECODE,  # o_proj
    (3072, 1024): _DECODE,  # gate_proj, up_proj
    (1024, 3072): _DECODE,  # down_proj
    (151936, 1024): _DECODE,  # lm_head (shares its entry's tile, the layers' one: `fit` below)
    (4096, 2048): _DECODE,  # Qwen3-30B-A3B q_proj (not timed)
    (512, 2048): _DECODE,  # k_proj, v_proj
    (2048, 4096): _DECODE,  # o_proj
    (151936, 2048): _DECODE,  # lm_head
    (768, 2048): _DECODE,  # GLM-4.7-Flash q_a_proj (not timed)
    (5120, 768): _DECODE,  # q_b_proj
    (576, 2048): _DECODE,  # kv_a_proj_with_mqa
    (10240, 2048): _DECODE,  # gate_proj, up_proj
    (1536, 2048): _DECODE,  # the shared expert's gate_proj, up_proj
    (154880, 2048): _DECODE,  # lm_head
}



# Hopper tiles for the fused kernel (two fp32 accumulators: 128x128 over 8 warps is 128 registers a
# thread for both), keyed by (N, K) like linear.triton's; tiny-dense keeps linear.triton's tiny tile.
_FUSED = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
# The persistent launch's tile at Qwen3-8B (`persistent_fits`): 128x256 over 8 warps, the fastest of the
# 5 tiles swept at both layers (docs/experiments.md). Its two accumulators take 256 registers a thread,
# so some may spill; whether they do was not examined. At M <= 256 it leaves SMs idle.
_PERSISTENT = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
HOPPER_ROW_PARALLEL_CONSTANTS = {
    (64, 64): HOPPER_CONSTANTS[64, 64],  # tiny-dense o_proj
    (64, 128): HOPPER_CONSTANTS[64, 128],  # tiny-dense down_proj
    (4096, 4096): _PERSISTENT,  # Qwen3-8B o_proj
    (4096, 12288): _PERSISTENT,  # Qwen3-8B down_proj
    (1024, 2048): _FUSED,  # Qwen3-0.6B o_proj
    (1024, 3072): _FUSED,  # Qwen3-0.6B down_proj
    (2048, 4096): _FUSED,  # Qwen3-30B-A3B o_proj (not timed)
    (2048, 5120): _FUSED,  # GLM-4.7-Flash o_proj (not timed)
    (2048, 10240): _FUSED,  # its dense layer's down_proj
    (2048, 1536): _FUSED,  # its shared expert's down_proj
}

TILES = {"sm_90": HOPPER_CONSTANTS}
DECODE_TILES = {"sm_90": HOPPER_DECODE_CONSTANTS}
ROW_PARALLEL_TILES = {"sm_90": HOPPER_ROW_PARALLEL_CONSTANTS}


def _dominant(ops, spec, table: dict) -> dict | None:
    work = {}
    for op in ops:
        for (n, k), count in spec.projections.get(op, {}).items():
            tile = table.get((n, k))
            if tile is not None:
                key = tuple(sorted(tile.items()))
                work[key] = work.get(key, 0) + n * k * count
    return dict(max(work, key=work.get)) if work else None


def _fit(tiles: dict, ops, cases, spec, arch: str) -> list[tuple[list[str], dict]] | None:
    if arch not in tiles:
        return None
    tile = _dominant(ops, spec, tiles[arch]) or {}
    decode = _dominant(ops, spec, DECODE_TILES.get(arch, {}))
    if decode is None or "engine_decode" not in cases or len(cases) == 1:
        return [(list(cases), tile)]
    return [([case for case in cases if case != "engine_decode"], tile), (["engine_decode"], {**tile, **decode})]


def fit(ops, cases, spec, arch: str):
    """linear.triton: [(cases, constants to set)] for the entry's ops, or None where `arch` has no table."""
    return _fit(TILES, ops, cases, spec, arch)


def fit_row_parallel(ops, cases, spec, arch: str):
    """linear.row_parallel.triton: as `fit`, with the fused kernel's tiles."""
    return _fit(ROW_PARALLEL_TILES, ops, cases, spec, arch)
