"""gdn/runs.py: a call's runs and chunk-piece tables, built on the host, against enumerations token by token; the
runs kept for the same unchanged tensors and found again for changed ones; the facts the Triton impls' input
checks read from them."""

import pytest
import torch

from conftest import DEVICE
from isoexec.ops.gdn.runs import find_runs, pieces


@pytest.mark.parametrize("pos0", [[0, 0, 0, 0], [0, 5, 15, 3]], ids=["runs from a chunk boundary", "runs from mid-chunk offsets"])
def test_the_piece_tables_list_every_chunk_piece_once(pos0):
    """find_runs and pieces (built on the host) against an enumeration token by token: per piece its run, the
    token at its chunk's offset 0 and the offsets [off, stop) it computes (from each run's position, or from
    offset 0 as the backward takes them); per run its length and first piece; every table on the device 16-byte
    aligned (the kernels' pointers keep one specialisation). The same positions object, unchanged, gives the same
    runs; changed in place, new ones."""
    lengths, chunk, state_ids = [1, 40, 16, 7], 16, [3, 3, 0, 1]  # the first two runs one sequence, positions apart
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(pos0, lengths)]).to(DEVICE)
    ids = torch.cat([torch.full((n,), s) for s, n in zip(state_ids, lengths)]).to(DEVICE)
    runs = find_runs(positions, ids)
    assert runs.starts.tolist() == runs.first.tolist() == [0, 1, 41, 57]
    for from_offsets in (True, False):
        (run_first, length, chunk0, run, tok0, off, stop), count = pieces(runs, chunk, sum(lengths), from_offsets)
        want = []  # (run, token at offset 0, off, stop) per piece, in order
        for r, (start, n) in enumerate(zip(runs.first.tolist(), lengths)):
            for t in range(n):
                at = (pos0[r] if from_offsets else 0) + t
                if t == 0 or at % chunk == 0:
                    want.append([r, start + t - at % chunk, at % chunk, at % chunk])
                want[-1][3] += 1
        got = [list(row) for row in zip(run.tolist(), tok0.tolist(), off.tolist(), stop.tolist())]
        assert count == len(want) and got == want
        assert length.tolist() == lengths and run_first.tolist() == [0, 1, 41, 57]
        assert chunk0.tolist() == [[w[0] for w in want].index(r) for r in range(len(lengths))]
        assert all(t.device == positions.device and t.dtype == torch.int32 and t.data_ptr() % 16 == 0
                   for t in (run_first, length, chunk0, run, tok0, off, stop))
    assert find_runs(positions, ids) is runs
    ids[41:] = 3  # runs 2 and 3 now one sequence's, with positions apart: still four runs, found again
    assert find_runs(positions, ids) is not runs
    positions[41:] = positions[40] + 1 + torch.arange(23, device=DEVICE)  # one run from token 1 on
    assert find_runs(positions, ids).first.tolist() == [0, 1]


def test_the_checks_facts():
    """The positions' minimum, the slots' range, a slot whose positions jump, a slot heading two runs."""
    positions = torch.tensor([0, 1, 2, 7, 8, 0, 1, 5], device=DEVICE)
    ids = torch.tensor([2, 2, 2, 2, 2, 0, 0, 2], device=DEVICE)
    runs = find_runs(positions, ids)
    assert runs.first.tolist() == [0, 3, 5, 7] and runs.first_positions.tolist() == [0, 7, 0, 5]
    assert runs.min_position == 0 and runs.slots == (0, 2) and runs.slot_jumps and runs.slot_in_two_runs
    runs = find_runs(torch.tensor([4, 5, 6, 0, 1], device=DEVICE), torch.tensor([1, 1, 1, 0, 0], device=DEVICE))
    assert runs.first.tolist() == [0, 3] and runs.slots == (0, 1) and not runs.slot_jumps and not runs.slot_in_two_runs
    runs = find_runs(torch.tensor([0, 1, -3], device=DEVICE), None)
    assert runs.min_position == -3 and runs.slots is None and not runs.slot_jumps
    empty = find_runs(torch.zeros(0, dtype=torch.long, device=DEVICE), None)
    assert empty.slots is None and empty.min_position == 0 and not empty.first_positions.any()


def test_inference_tensors_are_read_each_call():
    """torch.inference_mode's tensors (vLLM runs models so) track no version: their runs are never kept."""
    with torch.inference_mode():
        positions = torch.arange(6, device=DEVICE)
        runs = find_runs(positions, None)
        assert runs.first.tolist() == [0]
        positions[3:] = torch.arange(3, device=DEVICE)
        assert find_runs(positions, None).first.tolist() == [0, 3]
