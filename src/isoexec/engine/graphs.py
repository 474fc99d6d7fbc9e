"""Decode steps as fixed-shape forwards, one per batch-size bucket, captured as CUDA graphs on a GPU.

A decode step of B sequences runs padded to the smallest bucket >= B (1, 2, 4, … up to max_num_seqs,
and max_num_seqs itself). The forward only reads and writes static tensors: each step copies its
token ids, positions, write slots and slot table in, the graph replays, and the full-vocabulary rows
(and, when recorded, the experts each MoE layer chose: a static routing buffer the layers copy into)
are read out; sampling stays outside, on the first B rows. The slot table is as wide as the most keys
a decode row may have (`max_num_keys`); real rows keep UNUSED_SLOT past their own keys.

A padded row is token 0 at position 0 of its own table row, in a sequence slot of its own (for layers
with per-sequence state; a sequence at position 0 starts from zeros), and every one of its key slots and its
write slot is the scratch slot: the first slot of one extra cache page that the block manager never
hands out. It never reads or writes a page a sequence holds, and whichever attention impl runs sees
one finite key there, written by the same forward. Every contract op computes a row from the row's
own data and absolute position, and a row sees only keys <= its position, so the padding, the bucket
and the wider table leave the real rows' bits unchanged under a bitwise contract; under `native`
they need not.

On CUDA each bucket is captured at engine start, largest first into one memory pool, after an eager
warm-up run of the same padded forward (kernels compile, rope's table is built). Elsewhere the padded
forward runs eagerly, without capture: that is how the CPU tests show the padding bitwise neutral,
leaving only capture and replay themselves to a GPU. A graph keeps reading the tensors it was captured
with, so weights must be updated in place (as `rl/sync.py` does) and the cache is never reallocated.
"""

import torch
from torch import Tensor

from ..contract.schema import Contract
from ..model import PagedBatch, Step, is_tracing, routing_buffer, step
from ..ops.attention.metadata import UNUSED_SLOT


def decode_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes decode steps are padded to: the powers of two below max_num_seqs, then max_num_seqs."""
    buckets = [1]
    while buckets[-1] * 2 < max_num_seqs:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets) + ((max_num_seqs,) if max_num_seqs > 1 else ())


class DecodeGraphs:
    """The static tensors and one forward per bucket: a captured graph on CUDA, the eager padded forward elsewhere."""

    def __init__(self, model, contract: Contract, ops: dict, state: tuple, scratch_slot: int, max_num_seqs: int, max_num_keys: int,
                 record_routing: bool = False):
        self.model, self.contract, self.ops, self.state = model, contract, ops, state
        self.scratch_slot = scratch_slot
        self.buckets = decode_buckets(max_num_seqs)
        size, device = self.buckets[-1], next(model.parameters()).device
        # Every row starts as padding; a step overwrites its first B rows and restores the padding after them.
        self.input_ids = torch.zeros(size, dtype=torch.int64, device=device)  # [N], N = max_num_seqs
        self.positions = torch.zeros(size, dtype=torch.int64, device=device)  # [N]
        self.seq_ids = torch.arange(size, device=device)  # [N], one token per sequence: never changes
        self.write_slots = torch.full((size,), scratch_slot, dtype=torch.int64, device=device)  # [N]
        # Sequence slots (per-sequence layer state): padded row i owns slot N + i, which no sequence holds.
        self.padding_state_ids = torch.arange(size, 2 * size, device=device)  # [N]
        self.state_ids = self.padding_state_ids.clone()  # [N]
        self.slot_table = torch.full((size, max_num_keys), scratch_slot, dtype=torch.int64, device=device)  # [N, max_num_keys]
        self.routing = routing_buffer(model.spec, size, device) if record_routing else None  # [N, layers, k] or None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Tensor] = {}  # bucket -> the graph's static [bucket, V] rows
        if device.type == "cuda":
            self._capture()

    @property
    def max_num_keys(self) -> int:
        return self.slot_table.shape[1]

    def run(self, input_ids: Tensor, positions: Tensor, write_slots: Tensor, slot_table: Tensor,
            state_ids: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """One token per sequence: input_ids, positions, write_slots [B], slot_table [B, ≤ max_num_keys],
        state_ids [B] (sequence slots; None: 0 … B - 1) -> full-vocabulary log-prob rows [B, V] float32, bit
        for bit those of the unpadded forward, and the rows' expert ids [B, layers, k] when recorded (else None)."""
        num_seqs, num_keys = slot_table.shape
        bucket = next(b for b in self.buckets if b >= num_seqs)
        for static, values, padding in ((self.input_ids, input_ids, 0), (self.positions, positions, 0),
                                        (self.write_slots, write_slots, self.scratch_slot)):
            static[:num_seqs].copy_(values)
            static[num_seqs:bucket].fill_(padding)
        self.state_ids[:num_seqs].copy_(torch.arange(num_seqs) if state_ids is None else state_ids)
        self.state_ids[num_seqs:bucket].copy_(self.padding_state_ids[num_seqs:bucket])
        self.slot_table[:num_seqs, :num_keys].copy_(slot_table)
        self.slot_table[:num_seqs, num_keys:].fill_(UNUSED_SLOT)
        self.slot_table[num_seqs:bucket].fill_(self.scratch_slot)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            rows = self.outputs[bucket]
        else:
            rows = self._forward(bucket)
        routing = None if self.routing is None else self.routing[:num_seqs].clone()
        return rows[:num_seqs].clone(), routing  # the next replay overwrites the static rows

    def _forward(self, bucket: int) -> Tensor:
        batch = PagedBatch(self.positions[:bucket], self.seq_ids[:bucket], self.slot_table[:bucket], self.write_slots[:bucket],
                           self.state_ids[:bucket])
        routing = None if self.routing is None else self.routing[:bucket]
        with step(Step(case="engine_decode", ops=self.ops, batch=batch, state=self.state, routing=routing)):
            return self.model.logprobs(self.model(self.input_ids[:bucket], self.positions[:bucket]))  # [bucket, V]

    @torch.no_grad()
    def _capture(self) -> None:
        """Capture every bucket, largest first, into one memory pool, each after an eager warm-up run."""
        if is_tracing():
            raise RuntimeError("CUDA graphs are captured when the engine is built: build it outside `tracing(...)`")
        with torch.cuda.device(self.input_ids.device):
            pool = torch.cuda.graph_pool_handle()
            for bucket in reversed(self.buckets):
                self._forward(bucket)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph, pool=pool):
                        self.outputs[bucket] = self._forward(bucket)
                except Exception as error:
                    first = error  # a failed capture also fails capture_end; the op that broke it comes first
                    while first.__context__ is not None:
                        first = first.__context__
                    mixers = [f"{region} with {entry.impl}" for region in ("attention", "mla")
                              if (entry := self.contract.entry(region, "engine_decode")) is not None]
                    raise RuntimeError(
                        f"capturing the engine_decode forward (batch {bucket}) as a CUDA graph failed: {type(first).__name__}: {first}. "
                        "CUDA graphs need ops that never wait on the host while capturing (no .item(), int(tensor), "
                        f"host-to-device copies); contract {self.contract.name} runs {', '.join(mixers) or 'no attention'}. "
                        "Use capturable ops or set cuda_graphs = false."
                    ) from error
                self.graphs[bucket] = graph
