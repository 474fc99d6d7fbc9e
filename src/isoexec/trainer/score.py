"""The trainer side: full-vocabulary log-probabilities of packed variable-length sequences.

`trainer_score` runs without autograd (recomputing the behaviour policy's log-probs), `trainer_fwd`
with it (the training forward). Both pack sequences back to back into micro-batches of about
`micro_batch_tokens` tokens, in an order of their own: a row's bits never depend on the packing.
"""

import torch
from torch import Tensor

from ..contract.schema import Contract
from ..model import DenseModel, PackedKV, Step, bind, step
from ..ops.attention.metadata import packed_slot_table

TRAINER_CASES = ("trainer_fwd", "trainer_score")


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Greedy packing, longest sequences first (a composition no engine step shares)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, current, used = [], [], 0
    for i in order:
        if current and used + lengths[i] > max_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    return batches + ([current] if current else [])


def sequence_logprobs(model: DenseModel, contract: Contract, sequences: list[list[int]], *, case: str = "trainer_score",
                      micro_batch_tokens: int | None = None, device: str | torch.device = "cpu", labels: list[int] | None = None) -> list[Tensor]:
    """For each sequence of n tokens, the [n - 1, V] float32 rows: row j is the distribution of token j + 1.

    In `trainer_fwd` the rows carry autograd history back to the model's parameters.
    """
    if case not in TRAINER_CASES:
        raise ValueError(f"case must be one of {', '.join(TRAINER_CASES)}, got {case!r}")
    if any(len(s) < 2 for s in sequences):
        raise ValueError("every sequence needs at least two tokens (a prompt token and a scored token)")
    ops = bind(contract, model.spec, case)
    budget = micro_batch_tokens or contract.deployment.trainer.micro_batch_tokens
    out: list[Tensor | None] = [None] * len(sequences)
    grad = torch.enable_grad() if case == "trainer_fwd" else torch.no_grad()
    with grad:
        for batch in micro_batches([len(s) for s in sequences], budget):
            ids = torch.tensor([t for i in batch for t in sequences[i]], device=device)
            lengths = torch.tensor([len(sequences[i]) for i in batch], device=device)
            cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
            slot_table, seq_ids, positions = packed_slot_table(cu_seqlens)
            row_labels = None if labels is None else torch.tensor([labels[i] for i in batch], device=device)[seq_ids] * (1 << 32) + positions
            with step(Step(case=case, ops=ops, slot_table=slot_table, seq_ids=seq_ids, kv=PackedKV(), labels=row_labels)):
                rows = model.logprobs(model(ids, positions))  # [T, V]
            for j, i in enumerate(batch):
                start = int(cu_seqlens[j])
                out[i] = rows[start : start + len(sequences[i]) - 1]
    return out
