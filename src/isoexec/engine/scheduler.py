"""Which sequences compute which tokens this step.

Policy, per step, within max_num_batched_tokens tokens and max_num_seqs running sequences:
1. running sequences in admission order: a decoding one takes one token (getting a page if its last
   token starts one; when none is free the newest running sequence is preempted, possibly itself), a
   prefilling one takes its next chunk;
2. then waiting sequences in FIFO order (preempted ones first) are admitted while their whole token
   list fits in free pages (less prefix-cache hits) and the budget allows a chunk; the first that does
   not fit stops admission, so no request is overtaken forever.
A chunk is at most prefill_chunk_size tokens and ends wherever the step's token budget does: a row's
bits do not depend on where its chunk starts (every contract op computes a row from the row's own data
and absolute position; tests/engine cut chunks at arbitrary tokens).

Each running sequence holds one of max_num_seqs sequence slots (`Sequence.state_slot`), where layers with
per-sequence state (Gated DeltaNet) keep it; admission takes one, finishing and preemption give it back.
"""

from collections import deque

from .block_manager import BlockManager
from .config import EngineConfig
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, config: EngineConfig, stats: dict):
        self.config, self.stats = config, stats
        self.block_manager = BlockManager(config.num_pages, config.kv_page_size, config.prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.free_state_slots = list(range(config.max_num_seqs - 1, -1, -1))  # popped from the end: lowest first

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens of seq's prefill to compute now (0: none fit the budget)."""
        return max(0, min(len(seq) - seq.num_computed, budget, self.config.prefill_chunk_size))

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: drop the keys (cached full pages stay reusable), keep the tokens."""
        self.block_manager.free_pages(seq)
        self._release_slot(seq)
        seq.status, seq.num_computed, seq.num_scheduled = Status.WAITING, 0, 0
        self.waiting.appendleft(seq)
        self.stats["preemptions"] += 1

    def _release_slot(self, seq: Sequence) -> None:
        if seq.state_slot is not None:
            self.free_state_slots.append(seq.state_slot)
            seq.state_slot = None

    def schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        """-> (sequences prefilling a chunk, sequences decoding one token); sets seq.num_scheduled."""
        budget, prefills, decodes, kept = self.config.max_num_batched_tokens, [], [], []
        while self.running:
            seq = self.running.popleft()
            seq.num_scheduled = 0
            if seq.is_prefilling:
                seq.num_scheduled = self._chunk(seq, budget)
                if seq.num_scheduled:
                    prefills.append(seq)
            elif seq.drew_last:
                pass  # its last token is in flight (async scheduling): it finishes when that step resolves
            elif budget > 0:
                while not self.block_manager.can_append(seq):
                    if not self.running:
                        self._preempt(seq)
                        break
                    self._preempt(self.running.pop())
                else:
                    self.block_manager.append(seq)
                    seq.num_scheduled = 1
                    decodes.append(seq)
            if seq.status is Status.RUNNING:
                kept.append(seq)
            budget -= seq.num_scheduled
        self.running = deque(kept)

        while self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            if not self.block_manager.allocate(seq):
                break
            self.waiting.popleft()
            seq.state_slot = self.free_state_slots.pop()  # running < max_num_seqs: one is free
            self.stats["prefix_cache_hit_tokens"] += seq.num_computed
            seq.status, seq.prefill_end, seq.num_scheduled = Status.RUNNING, len(seq), self._chunk(seq, budget)
            prefills.append(seq)
            self.running.append(seq)
            budget -= seq.num_scheduled
        return prefills, decodes

    def can_overlap(self) -> bool:
        """Whether the next step may be scheduled before the tokens of the step in flight reach the host:
        nothing waits (admission matches prefixes by token, and a preempted sequence re-prefills its drawn
        tokens) and no decode needs a page the free list lacks (which would preempt)."""
        if self.waiting:
            return False
        size = self.config.kv_page_size
        wanted = sum(1 for seq in self.running
                     if not seq.is_prefilling and not seq.drew_last and (len(seq) - 1) // size >= len(seq.page_table))
        return wanted <= self.block_manager.num_free

    def launched(self, seqs: list[Sequence]) -> list[tuple[Sequence, int]]:
        """Advance seqs past the forward just launched -> (seq, index of the token it draws) for each seq that
        samples, in row order: the token's place is reserved (`Sequence.reserve`) until `resolve`."""
        drawn = []
        for seq in seqs:
            seq.num_computed += seq.num_scheduled
            seq.num_scheduled = 0
            if seq.num_computed == len(seq):
                drawn.append((seq, seq.reserve()))
        return drawn

    def resolve(self, seqs: list[Sequence], drawn: list[tuple[Sequence, int]], tokens: list[int], logprobs, rows,
                routing=None) -> list[Sequence]:
        """A launched step's outputs reached the host: tokens/logprobs [R]/rows [R, V] (on the device)/routing
        [R, layers, k] (or None) belong, in order, to `drawn`. Fill in the tokens, cache the newly computed full pages, finish.
        -> the sequences that finished. A row drawn for a sequence that finished as the step before resolved (the
        step was scheduled before that was known) is dropped."""
        finished = []
        for r, (seq, index) in enumerate(drawn):
            if seq.status is Status.RUNNING:
                seq.settle(index, tokens[r], logprobs[r : r + 1], rows[r], None if routing is None else routing[r])
        for seq in seqs:
            if seq.status is not Status.RUNNING:
                continue
            self.block_manager.cache_computed(seq)  # every token it hashes is known now
            if seq.finish_reason is not None:
                seq.status = Status.FINISHED
                self.block_manager.free_pages(seq)
                self._release_slot(seq)
                self.running.remove(seq)
                finished.append(seq)
        return finished
