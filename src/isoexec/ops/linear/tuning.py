"""GEMM tiles by device arch and weight shape (N, K), for linear.triton and linear.row_parallel.triton.

Each arch with tiles has a rule giving every (N, K) its tile: one for training and prefill, one for
engine_decode, one for the row-parallel fold. `fit` is how `contract.fit_contract` tunes an entry of
either impl to a model: the tile of the shapes doing most of the entry's work (weight elements over all
layers; lm_head counts once), never chosen from M. Where the decode rule gives a tile too, engine_decode
gets an entry of its own with it (the battery must then show decode rows bitwise equal to the other
cases' rows). An arch without a rule returns None: the entry keeps the contract's portable constants.
"""

from ...runtime.binding import SIBLINGS

# Hopper (H100/H200) tiles for bf16 boundaries. On one H200 (triton 3.6, benchmarks/sweep_gemm.py) no tile
# changed a bit of the output, BLOCK_K included, so these are speed choices; the battery still proves
# each on its device at the model's shapes. One tile serves every M, so the training tile is the fastest
# at M = 1024 and 4096 (the trainer's and prefill's sizes): 128x256x64 reached 0.93-1.06x cuBLAS with
# the persistent launch at Qwen3-8B shapes.
_BIG = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
_NARROW = dict(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4)
_WAVES = dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4)
_TINY = dict(block_m=64, block_n=32, block_k=32, num_warps=4, num_stages=2)  # not timed
# Decode batches (at most max_num_seqs rows): `benchmarks/profile_gpu.py gemm` timed 48 candidates as
# CUDA-graph replays (as decode runs) at M = 1, 16 and 64 on one H200; none changed a bit. At Qwen3-0.6B's
# shapes 64x32x256 (4 warps, 4 stages) was the fastest or within 4% of it in the sum over M at every layer
# shape, level with cuBLAS for q_proj and gate/up and faster for k/v. One row tile holds the whole batch,
# so each weight tile is read once, and each program streams its columns' whole K: the 16x32x128 tile it
# replaced re-read weights for every 16 rows (1.15-1.7x slower at M = 64). How many columns a program
# takes is `_decode_width`'s.
_DECODE = dict(block_m=64, block_n=32, block_k=256, num_warps=4, num_stages=4)
DECODE_WIDTHS = (32, 64)
# The row-parallel fold holds two fp32 accumulators: 128x128 over 8 warps is 128 registers a thread for
# both. 128x256 over 8 warps was the fastest of 5 tiles swept at Qwen3-8B's o_proj and down_proj
# (docs/experiments.md); its accumulators take 256 registers a thread, so some may spill (not examined).
_FUSED = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
_PERSISTENT = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)

NUM_SMS = 132  # H100 and H200 SXM
TRAINER_M = 1024  # the smaller training size: where the count of tiles against SMs decides


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tiles(n: int, block_m: int, block_n: int) -> int:
    return -(-TRAINER_M // block_m) * -(-n // block_n)


def _fill(n: int, block_m: int, block_n: int) -> float:
    """The share of the SMs' waves that output tiles keep busy at M = TRAINER_M."""
    tiles = _tiles(n, block_m, block_n)
    return tiles / (-(-tiles // NUM_SMS) * NUM_SMS)


def _is_tiny(n: int, k: int) -> bool:
    # Test-sized models (tiny-dense: N, K <= 512 with K <= 128): the portable tile, no decode tile.
    return min(n, k) < 256


def hopper_tile(n: int, k: int) -> dict:
    """linear.triton's training and prefill tile for an [N, K] weight on Hopper."""
    if _is_tiny(n, k):
        return _TINY
    # 128x256 tiles at M = 1024 number at most 48 up to N = 1536, a third of the SMs; 64x256 doubles them.
    if n <= 1536:
        return _NARROW
    # Where 128x256 tiles spill into a wave they fill badly and 128x128 fills its waves nearly whole, take
    # 128x128. At N = 6144 (Qwen3-8B's fused qkv, 73% filled against 97%) it reached 0.88x cuBLAS at M = 1024
    # where 128x256 reached 0.76x; at full waves (M = 4096) it is the slower tile (0.90x against 0.97x), so
    # smaller gains in fill do not pay.
    if _tiles(n, 128, 256) > NUM_SMS and _fill(n, 128, 256) < 0.75 and _fill(n, 128, 128) >= 0.9:
        return _WAVES
    return _BIG


def _decode_width(launches: dict[tuple[int, int], int]) -> int:
    """The decode tile's columns for an entry whose decode runs `launches` ((N, K) -> launches per step).

    Decode streams weights: a program reads block_n columns of the whole K, and a launch of more tiles than
    SMs takes ceil(tiles / SMs) rounds of them. Take the width that streams the fewest weight bytes per SM
    over the step, and of equals the one with fewer rounds: each round pays its pipeline fill and epilogue
    again. At Qwen3-8B's shapes (`profile_gpu.py gemm --model qwen3-8b-random`, M = 64) that ranks as the
    sweep did: 32 columns for N = 1024, 4096 and 12288 (one round of 32 against half the SMs idle with 64,
    or 3 rounds of 32 against 2 of 64), 64 for the joined qkv (N = 6144), the joined gate/up (24576) and
    lm_head, where 64 halves the rounds at equal bytes: 11, 7 and 11% faster than 32.
    """

    def cost(width):  # (weight elements an SM streams, rounds of programs), over the step
        rounds = {(n, k): _cdiv(_cdiv(n, width), NUM_SMS) for n, k in launches}
        return (sum(count * rounds[n, k] * width * k for (n, k), count in launches.items()),
                sum(count * rounds[shape] for shape, count in launches.items()))

    return min(DECODE_WIDTHS, key=cost)


def hopper_decode_fit(launches: dict[tuple[int, int], int]) -> dict | None:
    """linear.triton's and linear.row_parallel.triton's engine_decode tile on Hopper for an entry whose decode
    runs `launches` ((N, K) -> launches per step); None where every shape is tiny: its decode keeps the
    training tile."""
    sized = {(n, k): count for (n, k), count in launches.items() if not _is_tiny(n, k)}
    return {**_DECODE, "block_n": _decode_width(sized)} if sized else None


def hopper_decode_tile(n: int, k: int) -> dict | None:
    """The engine_decode tile of one [N, K] launch alone (`hopper_decode_fit`)."""
    return hopper_decode_fit({(n, k): 1})


def hopper_row_parallel_tile(n: int, k: int) -> dict:
    """linear.row_parallel.triton's tile for an [N, K] weight on Hopper: 128x256 where its tiles fill the
    SMs at M = 1024 (Qwen3-8B's N = 4096), else 128x128 (N = 1024 and 2048 leave half the SMs idle with
    128x256). Which launch runs it, grid or persistent, is `row_parallel_triton.persistent_fits`'."""
    if _is_tiny(n, k):
        return _TINY
    return _PERSISTENT if _fill(n, 128, 256) >= 0.9 else _FUSED


TILES = {"sm_90": hopper_tile}
DECODE_TILES = {"sm_90": hopper_decode_fit}  # arch -> rule over an entry's decode launches
ROW_PARALLEL_TILES = {"sm_90": hopper_row_parallel_tile}


def _dominant(ops, spec, rule) -> dict | None:
    work = {}
    for op in ops:
        for (n, k), count in spec.projections.get(op, {}).items():
            tile = rule(n, k)
            if tile is not None:
                key = tuple(sorted(tile.items()))
                work[key] = work.get(key, 0) + n * k * count
    return dict(max(work, key=work.get)) if work else None


def decode_launches(ops, spec) -> dict[tuple[int, int], int]:
    """(N, K) -> how many GEMMs of that shape a decode step launches for the entry's ops: sibling projections
    a layer holds joined (`runtime.binding.SIBLINGS`: an entry pins them to one impl with one set of
    constants, so the engine calls them as one) count once with their widths summed; lm_head once."""
    out: dict[tuple[int, int], int] = {}

    def launch(shape):
        out[shape] = out.get(shape, 0) + 1

    for layer in spec.layers:
        for part in (layer.mixer, layer.ffn):
            shapes = {op: shape for op, shape in part.projections(spec.hidden_size).items() if op in ops}
            for names in SIBLINGS:
                if all(name in shapes for name in names) and len({shapes[name][1] for name in names}) == 1:
                    launch((sum(shapes[name][0] for name in names), shapes[names[0]][1]))
                    for name in names:
                        del shapes[name]
            for shape in shapes.values():
                launch(shape)
    if "lm_head" in ops:
        launch((spec.vocab_size, spec.hidden_size))
    return out


def _fit(rules: dict, ops, cases, spec, arch: str) -> list[tuple[list[str], dict]] | None:
    if arch not in rules:
        return None
    tile = _dominant(ops, spec, rules[arch]) or {}
    decode = DECODE_TILES[arch](decode_launches(ops, spec)) if arch in DECODE_TILES else None
    if decode is None or "engine_decode" not in cases or len(cases) == 1:
        return [(list(cases), tile)]
    return [([case for case in cases if case != "engine_decode"], tile), (["engine_decode"], {**tile, **decode})]


def fit(ops, cases, spec, arch: str):
    """linear.triton: [(cases, constants to set)] for the entry's ops, or None where `arch` has no rule."""
    return _fit(TILES, ops, cases, spec, arch)


def fit_row_parallel(ops, cases, spec, arch: str):
    """linear.row_parallel.triton: as `fit`, with the fold's tiles."""
    return _fit(ROW_PARALLEL_TILES, ops, cases, spec, arch)
