"""Turns scheduled sequences into one forward of the unified model in one case, and samples.

With `cuda_graphs` on, decode steps run padded to a batch-size bucket through `graphs.py` (captured
on a GPU, eager elsewhere); prefill chunks, and every step while tracing, run eagerly as they are."""

import functools
import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from ..contract.schema import Contract
from ..model import PagedBatch, Step, allocate, is_tracing, routing_buffer, step
from ..ops.common import torch_dtype
from ..parallel import compose
from ..runtime.binding import bind
from .config import ENGINE_CASES, EngineConfig
from .graphs import DecodeGraphs
from .sequence import PENDING, Sequence


@dataclass
class Forward:
    """One forward's draws, on the device: tokens [R] int64, their log-probs [R] float32, the full-vocabulary
    rows [R, V] float32 they were drawn from, and the rows' expert ids [R, layers, k] int64 when recorded (else None)."""

    tokens: Tensor
    logprobs: Tensor
    rows: Tensor
    routing: Tensor | None


class ModelRunner:
    def __init__(self, model, contract: Contract, config: EngineConfig, device: str, mesh=None):
        spec, self.model, self.page_size, self.device = model.spec, model, config.kv_page_size, torch.device(device)
        self.record_routing = config.record_routing
        kv_dtypes = {contract.entry("attention", case).constants.get("kv_cache_dtype") for case in ENGINE_CASES
                     if contract.entry("attention", case) is not None}
        if kv_dtypes and kv_dtypes != {spec.dtype}:
            raise ValueError(f"contract {contract.name} stores keys as {sorted(map(str, kv_dtypes))} but the model is {spec.dtype}: "
                             "fit the contract to the model first (isoexec.contract.fit_contract)")
        self.binding = bind(contract, spec, ENGINE_CASES)
        self.ops = {case: self.binding.ops[case] for case in ENGINE_CASES}
        if mesh is not None and mesh.world > 1:  # a rank of a parallel side: the ops composed with its collectives
            if config.cuda_graphs:
                raise ValueError("CUDA graphs with a parallel engine are not built yet (the ranks' collectives run on gloo, "
                                 "through host memory): set cuda_graphs = false")
            self.ops = {case: compose(ops, contract, case, model.unsharded_spec, mesh) for case, ops in self.ops.items()}
        # With graphs, one scratch page past the block manager's pages takes the padded decode rows (graphs.py); a
        # replica in lockstep (EP over the replicas) writes its padding rows there too (`idle`).
        scratch_slot = config.num_pages * self.page_size
        self.scratch_slot = scratch_slot
        lockstep = mesh is not None and mesh.ep_spans_groups
        # Sequence slots: one per running sequence, and with graphs one more per padded decode row (graphs.py); in
        # lockstep, one more for the padding row.
        # A recurrent layer's rows are laid out by the contract's gdn.core impl (both engine cases share the cache).
        gdn = next(((contract.entry("gdn.core", case), self.binding.installed["gdn.core", case]) for case in ENGINE_CASES
                    if ("gdn.core", case) in self.binding.installed), None)
        num_sequences = config.max_num_seqs * (2 if config.cuda_graphs else 1)
        self.idle_state_slot = num_sequences
        self.state = allocate(spec, scratch_slot + (config.cuda_graphs or lockstep) * self.page_size, torch_dtype(spec.dtype), self.device,
                              num_sequences=num_sequences + lockstep,
                              chunk_size=None if gdn is None else gdn[0].constants.get("chunk_size"),
                              row_width=None if gdn is None else functools.partial(gdn[1].row_width, constants=dict(gdn[0].constants)))
        self.decode_graphs = None
        if config.cuda_graphs:
            # The most keys an admitted sequence can have, capped at the contract's decode shape domain: a
            # step past it (where the contract claims nothing) runs eagerly rather than widen every graph.
            max_num_keys = min(scratch_slot, spec.max_position_embeddings, contract.cases["engine_decode"].shape_domain.max_seq_len,
                               config.max_model_len or spec.max_position_embeddings)
            self.decode_graphs = DecodeGraphs(model, contract, self.ops["engine_decode"], self.state,
                                              scratch_slot, config.max_num_seqs, max_num_keys, config.record_routing)

    def reset(self) -> None:
        """Poison the whole cache again: nothing from an earlier `generate` (older weights) is readable."""
        for store in self.state:
            if store is not None:
                store.poison()

    def _upload(self, values: list, dtype) -> Tensor:
        """values as one tensor on the engine's device. On a GPU the copy goes through pinned memory, so it never
        waits for the device to drain its queue (a copy from pageable memory does) and a step can be prepared
        while the one before it still runs."""
        host = torch.tensor(values, dtype=dtype)
        return host.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else host

    @torch.no_grad()
    def idle(self, case: str) -> None:
        """A forward in `case` of one padding row, its output dropped: token 0 at position 0, its key written to and
        read from the scratch slot, its layer state in a sequence slot no sequence holds. What a replica with nothing
        of `case` to run computes while another replica runs it, so that the MoE layers' exchanges over every
        replica meet (EP over the replicas)."""
        values = self._upload([0, 0, 0, self.idle_state_slot, self.scratch_slot], torch.int64)
        input_ids, positions, seq_ids, state_ids, slot = values.split(1)
        batch = PagedBatch(positions, seq_ids, slot.view(1, 1), slot, state_ids)
        with step(Step(case=case, ops=self.ops[case], batch=batch, state=self.state, labels=None, routing=None)):
            self.model(input_ids, positions)

    @torch.no_grad()
    def run(self, seqs: list[Sequence], case: str, feed: tuple[Tensor, dict[int, int]] | None = None) -> Forward:
        """Compute each seq's scheduled tokens [num_computed, num_computed + num_scheduled) in one forward, and
        sample; on a GPU nothing here waits on the device, unless a request filters by top-k or top-p (the
        sampler then reads which rows do).

        -> the outputs of the R seqs whose chunk reaches their last token, in order: token r is drawn from row r,
        computed at position len(seq) - 1, with the request's seed and sampling position len(seq), the position
        the new token will occupy. feed: the device tokens of the step still in flight, and each of its drawing
        seqs' row there (by id(seq)); an input token still PENDING on the host is read from there."""
        ids, positions, seq_ids, state_ids, labels, feed_to, feed_from = [], [], [], [], [], [], []
        tracing = is_tracing()
        for b, seq in enumerate(seqs):
            start, end = seq.num_computed, seq.num_computed + seq.num_scheduled
            if seq.token_ids[end - 1] == PENDING:  # one step is in flight at most: only the last input can be pending
                if feed is None or id(seq) not in feed[1]:
                    raise RuntimeError(f"request {seq.request_id}: its input token is still in flight, but no step feeds it (engine bug)")
                feed_to.append(len(ids) + end - start - 1)
                feed_from.append(feed[1][id(seq)])
            ids += seq.token_ids[start:end]
            positions += range(start, end)
            seq_ids += [b] * (end - start)
            state_ids += [seq.state_slot] * (end - start)
            if tracing:  # names each row (request, position) for audit --trace
                labels += [(seq.request_id << 32) | p for p in range(start, end)]
        sampled = [seq for seq in seqs if seq.samples_this_step]
        params = [seq.params for seq in sampled]
        ends = list(itertools.accumulate(seq.num_scheduled for seq in seqs))
        last_rows = [end - 1 for end, seq in zip(ends, seqs) if seq.samples_this_step]
        max_pages = max(len(seq.page_table) for seq in seqs)
        table = [page for seq in seqs for page in seq.page_table + [-1] * (max_pages - len(seq.page_table))]
        # Everything the step reads, in one copy of integers and one of floats.
        ints = [ids, positions, seq_ids, state_ids, table, last_rows, [p.top_k for p in params], [seq.seed for seq in sampled],
                [len(seq) for seq in sampled], feed_to, feed_from]
        (input_ids, positions, seq_ids, state_ids, block_table, last_rows, top_k, seeds, sample_positions, feed_to, feed_from) = \
            self._upload([x for part in ints for x in part], torch.int64).split([len(part) for part in ints])
        temperature, top_p = self._upload([p.temperature for p in params] + [p.top_p for p in params], torch.float32).split([len(params)] * 2)
        if len(feed_to):
            input_ids[feed_to] = feed[0][feed_from]
        block_table = block_table.view(len(seqs), max_pages)  # [B, P]
        num_keys = max(seq.num_computed + seq.num_scheduled for seq in seqs)
        batch = PagedBatch.of(block_table, self.page_size, num_keys, seq_ids, positions, state_ids)  # slot table [B, num_keys]

        ops = self.ops[case]
        graphs = self.decode_graphs
        if case == "engine_decode" and graphs is not None and not tracing and num_keys <= graphs.max_num_keys:
            rows, routing = graphs.run(input_ids, positions, batch.write_slots, batch.slot_table, state_ids)  # every decode samples
        else:
            labels = self._upload(labels, torch.int64) if tracing else None
            routing = routing_buffer(self.model.spec, len(input_ids), self.device) if self.record_routing else None  # [T, layers, k]
            with step(Step(case=case, ops=ops, batch=batch, state=self.state, labels=labels, routing=routing)):
                hidden = self.model(input_ids, positions)  # [T, hidden]
                if not sampled:
                    return Forward(input_ids.new_empty(0), temperature.new_empty(0), temperature.new_empty(0, self.model.spec.vocab_size), None)
                rows = self.model.logprobs(hidden[last_rows])  # [R, V] float32
            routing = None if routing is None else routing[last_rows]  # [R, layers, k]
        vocab_size = self.model.spec.vocab_size
        tokens = ops["sample"](rows, temperature, top_k, top_p, seeds, sample_positions,
                               may_filter=any(p.filters(vocab_size) for p in params))  # [R]
        logprobs = rows.gather(1, tokens[:, None])[:, 0]  # [R], the bits of the row, never via a Python float
        return Forward(tokens, logprobs, rows, routing)
