"""The trainer side: full-vocabulary log-probabilities of packed variable-length sequences.

A `Trainer` binds its contract once and runs `trainer_score` without autograd (recomputing the
behaviour policy's log-probs) or `trainer_fwd` with it (the training forward). Both pack sequences
back to back into micro-batches of about `micro_batch_tokens` tokens, in an order of their own: a row's
bits never depend on the packing.
"""

import torch
from torch import Tensor

from ..contract.schema import Contract
from ..model import PackedBatch, Step, packed_state, routing_buffer, step
from ..parallel import Mesh, compose
from ..parallel.data import dp_micro_batches, fully_shard_model, gather_objects, gather_sequences
from ..runtime.binding import bind

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


class Trainer:
    """The model and the bound ops of the trainer cases: bound once, used for every step. With a `mesh` whose model
    group has more than one rank, `model` is this rank's shard (`parallel.shard`) and the ops are composed with the
    collectives it needs (`parallel.compose`); with data parallelism (`mesh.dp` > 1) the model's parameters are
    sharded over the groups (FSDP2) and each group scores its share of the sequences. Every rank returns every
    sequence's rows."""

    def __init__(self, model, contract: Contract, mesh=None):
        self.mesh = mesh if mesh is not None else Mesh()
        self.contract = contract
        self.binding = bind(contract, model.spec, TRAINER_CASES)
        self.ops = {case: self.binding.ops[case] for case in TRAINER_CASES}
        if self.mesh.world > 1:
            self.ops = {case: compose(ops, contract, case, model.unsharded_spec, self.mesh) for case, ops in self.ops.items()}
        self.model = fully_shard_model(model, self.mesh) if self.mesh.dp > 1 else model
        self.state = packed_state(model.spec)

    def logprobs(self, sequences: list[list[int]], *, case: str = "trainer_score", micro_batch_tokens: int | None = None,
                 device: str | torch.device = "cpu", labels: list[int] | None = None,
                 routing: bool = False) -> list[Tensor] | tuple[list[Tensor], list[Tensor | None]]:
        """For each sequence of n tokens, the [n - 1, V] float32 rows: row j is the distribution of token j + 1.

        In `trainer_fwd` the rows carry autograd history back to the model's parameters. With `routing`,
        (rows, routing): also each sequence's [n, layers, k] expert ids, position j's in row j, recorded
        in the same forward (`model.routing_buffer`; None for a model without MoE layers).
        """
        if case not in TRAINER_CASES:
            raise ValueError(f"case must be one of {', '.join(TRAINER_CASES)}, got {case!r}")
        if any(len(s) < 2 for s in sequences):
            raise ValueError("every sequence needs at least two tokens (a prompt token and a scored token)")
        model, ops, mesh = self.model, self.ops[case], self.mesh
        budget = micro_batch_tokens or self.contract.deployment.trainer.micro_batch_tokens
        lengths = [len(s) for s in sequences]
        batches = micro_batches(lengths, budget) if mesh.dp == 1 else dp_micro_batches(lengths, budget, mesh.dp, micro_batches)[mesh.dp_rank]
        out: list[Tensor | None] = [None] * len(sequences)
        experts: list[Tensor | None] = [None] * len(sequences)
        grad = torch.enable_grad() if case == "trainer_fwd" else torch.no_grad()
        with grad:
            for batch in batches:
                ids = torch.tensor([t for i in batch for t in sequences[i]], device=device)
                lengths = [len(sequences[i]) for i in batch]
                packed = PackedBatch.of(lengths, device)
                row_labels = None
                if labels is not None:
                    row_labels = torch.tensor([labels[i] for i in batch], device=device)[packed.seq_ids] * (1 << 32) + packed.positions
                recorded = routing_buffer(model.spec, len(ids), device) if routing else None  # [T, layers, k]
                with step(Step(case=case, ops=ops, batch=packed, state=self.state, labels=row_labels, routing=recorded)):
                    rows = model.logprobs(model(ids, packed.positions))  # [T, V]
                start = 0
                for i, length in zip(batch, lengths):
                    out[i] = rows[start : start + length - 1]
                    if recorded is not None:
                        experts[i] = recorded[start : start + length]
                    start += length
            if mesh.dp > 1:  # every group's share, for every rank
                if routing:
                    host = gather_objects({i: None if experts[i] is None else experts[i].cpu() for b in batches for i in b}, len(sequences), mesh)
                    experts = [None if t is None else t.to(device) for t in host]
                out = gather_sequences({i: out[i] for b in batches for i in b}, len(sequences), mesh)
        return (out, experts) if routing else out


def sequence_logprobs(model, contract: Contract, sequences: list[list[int]], **kwargs) -> list[Tensor]:
    """`Trainer(model, contract).logprobs(sequences, ...)`, for one call; a training loop keeps its Trainer."""
    return Trainer(model, contract).logprobs(sequences, **kwargs)
