"""A user's own launcher: run under torchrun, each rank scores the sequences in SEQUENCES_JSON on its shard of
tiny-dense (the mesh read from torchrun's environment by `Mesh.from_env`), and rank 0 saves the rows to OUT.

    python -m torch.distributed.run --standalone --nproc-per-node N torchrun_rows.py SEQUENCES_JSON OUT
"""

import json
import sys

import torch
import torch.distributed as dist

from isoexec.contract import load_preset
from isoexec.model import PRESETS, init_random
from isoexec.parallel import Mesh, shard
from isoexec.trainer import Trainer


def main(sequences_json: str, out: str) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo")
    try:
        mesh = Mesh.from_env()
        contract = load_preset("tiny-dense")
        model = shard(init_random(PRESETS["tiny-dense"], seed=0), contract, mesh)
        with open(sequences_json) as f:
            sequences = json.load(f)
        rows = [r.detach() for r in Trainer(model, contract, mesh).logprobs(sequences, case="trainer_score")]
        if dist.get_rank() == 0:
            torch.save(rows, out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
