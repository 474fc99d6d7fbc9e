"""attention.triton's tile in Gluon (`ops/attention/gluon_tile.py`): every output bit equal to the Triton walk's, in
the forms the trainer and the engine make (packed sequences, a prefill chunk after cached keys, decode steps), at
head_dim 128 on a Hopper GPU; a re-blocked fold (the control) differs. No interpreter runs Gluon, so off a GPU the
kernel is compiled for sm_90a and assembled by ptxas (`benchmarks/attention_gluon.py --compile-only`)."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from conftest import DEVICE, ON_GPU, int_view, randn

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.gpu  # gpu_checks.sh selects the device's tests by this marker

from isoexec.ops.attention import gluon_tile, packed_slot_table, paged_slot_table  # noqa: E402
from isoexec.ops.attention import triton as attention_triton  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
PTXAS = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9
BF16 = dict(input_dtype="bfloat16", output_dtype="bfloat16", kv_cache_dtype="bfloat16", accum_dtype="float32", block_m=64,
            block_n=32, num_warps=4, num_stages=3, split_kv_size=0)  # tiny-dense-triton's attention constants


@pytest.mark.skipif(ON_GPU or not PTXAS.exists() or not gluon_tile.available(),
                    reason="compiled on a GPU by the GPU tests; needs Triton's Gluon and ptxas otherwise")
def test_the_gluon_tile_compiles_for_hopper(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attention_gluon.py"), "--compile-only"], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("tile")]
    assert len(rows) == 14, result.stdout
    assert all(0 < int(row[row.index("registers") + 1]) <= 255 for row in rows), result.stdout
    # the overlapped loop waits with one wgmma group in flight; the walk's order waits for each at once
    overlapped = [row for row in rows if row[0].startswith("tile-overlap")]
    assert len(overlapped) == 7 and all("'1'" in " ".join(row) for row in overlapped), result.stdout
    assert not any("'1'" in " ".join(row) for row in rows if row not in overlapped), result.stdout


gpu = pytest.mark.skipif(not (HOPPER and gluon_tile.available()), reason="the Gluon tile runs on a Hopper GPU")


def _both(args, monkeypatch, constants=BF16, lse=False, overlap=False):
    """(the Triton walk's output, the Gluon tile's) for one call, the tile's loop overlapped or in the walk's order; with
    lse, each one's log-sum-exp too. The second call must have gone to the tile (else the comparison would be the walk's
    with itself), so decode calls keep to the tile, not the spread path."""
    from isoexec.ops.attention import triton_blocks

    monkeypatch.setattr(triton_blocks, "BLOCKS_MIN", None)
    monkeypatch.setattr(gluon_tile, "OVERLAP", overlap)
    launches = []
    launch = gluon_tile.attention_fwd
    monkeypatch.setattr(gluon_tile, "attention_fwd", lambda *a, **kw: launches.append(1) or launch(*a, **kw))
    outputs = []
    for enabled in (False, True):
        monkeypatch.setattr(gluon_tile, "ENABLED", enabled)
        q = args[0]
        kept = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if lse else None
        out = attention_triton.attention_fwd(*args, None, q.dtype, constants["block_m"], constants["block_n"], constants["num_warps"],
                                             constants["num_stages"], lse=kept)
        outputs.append((out, kept))
        assert len(launches) == enabled
    return outputs


def _packed(lengths, heads, kv_heads, dtype=torch.bfloat16, seed=0):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE)
    slot_table, seq_ids, positions = packed_slot_table(cu)
    t = sum(lengths)
    q, k, v = (randn(t, h, 128, seed=seed + i, dtype=dtype) for i, h in enumerate((heads, kv_heads, kv_heads)))
    return q, k, v, slot_table, seq_ids, positions, 128**-0.5


@gpu
@pytest.mark.parametrize("heads", [4, 8])  # 2 query heads per KV head, 4 (the walk stacks two 64-row tiles there)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("overlap", [False, True])
def test_packed_rows_and_log_sum_exp_equal_the_walks(heads, dtype, overlap, monkeypatch):
    """The trainer's form: sequences packed back to back, short and long, across tile and key-block edges."""
    args = _packed([300, 1, 17, 64, 65, 33, 200, 16], heads, 2, dtype)
    (walk, walk_lse), (tile, tile_lse) = _both(args, monkeypatch, lse=True, overlap=overlap)
    assert torch.equal(int_view(tile), int_view(walk))
    assert torch.equal(int_view(tile_lse), int_view(walk_lse))


@gpu
@pytest.mark.parametrize("heads", [4, 8])
def test_a_prefill_chunk_after_cached_keys_equals_the_walks(heads, monkeypatch):
    """The engine's form: two sequences' chunks after 250 and 31 cached keys in pages of 16 slots in random order; every
    slot not written is NaN, the second sequence's table row maps 249 of them past its last key (keys no row sees,
    inside the key blocks its tiles walk: they must not reach a row)."""
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    context, chunk, page = (250, 31), (100, 70), 16
    keys = [c + n for c, n in zip(context, chunk)]
    pages = -(-max(keys) // page)
    block_table = torch.randperm(2 * pages, generator=generator, device=DEVICE).view(2, pages)
    slot_table = paged_slot_table(block_table, page, max(keys))
    k = torch.full((2 * pages * page, 2, 128), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    v = k.clone()
    for b, n in enumerate(keys):
        k[slot_table[b, :n]] = randn(n, 2, 128, seed=10 + b, dtype=torch.bfloat16)
        v[slot_table[b, :n]] = randn(n, 2, 128, seed=20 + b, dtype=torch.bfloat16)
    positions = torch.cat([torch.arange(c, c + n, device=DEVICE) for c, n in zip(context, chunk)])
    seq_ids = torch.cat([torch.full((n,), b, device=DEVICE) for b, n in enumerate(chunk)])
    q = randn(sum(chunk), heads, 128, seed=30, dtype=torch.bfloat16)
    (walk, _), (tile, _) = _both((q, k, v, slot_table, seq_ids, positions, 128**-0.5), monkeypatch)
    assert not tile.isnan().any()
    assert torch.equal(int_view(tile), int_view(walk))


@gpu
@pytest.mark.parametrize("heads", [4, 8])
@pytest.mark.parametrize("overlap", [False, True])
def test_decode_rows_equal_training_rows_whichever_kernel_computes_them(heads, overlap, monkeypatch):
    """The contract's claim across kernels: decode steps (one query a sequence, a 64-row tile each) by the tile or by
    the walk give the rows the trainer's packed call gives, by the tile or by the walk."""
    q, k, v, slot_table, seq_ids, positions, scale = _packed([70, 33, 300], heads, 2)
    starts = (0, 70, 103)
    trained = [out for out, _ in _both((q, k, v, slot_table, seq_ids, positions, scale), monkeypatch, overlap=overlap)]
    for step in ((69, 32, 299), (50, 20, 256), (31, 0, 95), (32, 31, 64)):
        rows = torch.tensor([start + p for start, p in zip(starts, step)], device=DEVICE)
        call = (q[rows], k, v, slot_table, torch.arange(3, device=DEVICE), torch.tensor(step, device=DEVICE), scale)
        for decoded, _ in _both(call, monkeypatch, overlap=overlap):
            for train in trained:
                assert torch.equal(int_view(decoded), int_view(train[rows])), step


@gpu
def test_a_refolded_tile_is_caught(monkeypatch):
    """The control: the same Gluon tile folding the online softmax over 64-key blocks is other arithmetic, and the
    comparison above sees it."""
    q, k, v, slot_table, seq_ids, positions, scale = _packed([300, 200], 8, 2)
    (walk, _), _ = _both((q, k, v, slot_table, seq_ids, positions, scale), monkeypatch)
    refolded = gluon_tile.attention_fwd(q, k, v, slot_table, seq_ids, positions, scale, torch.empty_like(q), None, group=4, g_pad=4,
                                        tile_positions=32, queries=32, block_n=64, num_warps=8)
    assert (int_view(refolded) != int_view(walk)).sum() > 0
