"""Pages of the KV cache: who holds which, and which full pages can be shared by their prefix.

A full page is known by a chain hash of (previous page's hash, its own tokens). The keys of position j
depend only on tokens 0 … j (every op is row-invariant), so a page with the same chain holds exactly
the bits a recompute would write, and a later sequence may read it instead. A page is hashed only after
its keys are computed, so a hit never reads a slot nobody has written.
"""

import hashlib
from collections import OrderedDict

import numpy as np

from .sequence import Sequence


def chain_hash(previous: bytes, tokens: list[int]) -> bytes:
    return hashlib.sha256(previous + np.asarray(tokens, dtype=np.int64).tobytes()).digest()


class Page:
    def __init__(self, page_id: int):
        self.page_id = page_id
        self.ref_count = 0
        self.hash: bytes | None = None  # set while the page is in the prefix cache
        self.tokens: tuple[int, ...] = ()  # compared on a hit, so a hash collision cannot alias pages


class BlockManager:
    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool):
        self.page_size, self.prefix_caching = page_size, prefix_caching
        self.pages = [Page(i) for i in range(num_pages)]
        # Free pages in eviction order: pages without cached content first, then cached ones, least
        # recently freed first, so a reusable prefix survives as long as possible.
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_pages))
        self.cached: dict[bytes, int] = {}  # chain hash -> page id

    @property
    def num_free(self) -> int:
        return len(self.free)

    def pages_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def _take(self) -> int:
        page_id, _ = self.free.popitem(last=False)
        page = self.pages[page_id]
        if page.hash is not None:  # evict its cached prefix
            del self.cached[page.hash]
            page.hash, page.tokens = None, ()
        page.ref_count = 1
        return page_id

    def _match(self, seq: Sequence) -> tuple[list[int], list[bytes]]:
        """Cached pages holding seq's leading full pages; never the page of its last token, which
        must be computed to give the row its next token is drawn from."""
        hits, hashes, previous = [], [], b""
        if not self.prefix_caching:
            return hits, hashes
        for i in range((len(seq) - 1) // self.page_size):
            tokens = seq.token_ids[i * self.page_size : (i + 1) * self.page_size]
            previous = chain_hash(previous, tokens)
            page_id = self.cached.get(previous)
            if page_id is None or self.pages[page_id].tokens != tuple(tokens):
                break
            hits.append(page_id)
            hashes.append(previous)
        return hits, hashes

    def allocate(self, seq: Sequence) -> bool:
        """Give seq pages for all its tokens, reusing cached prefix pages; False (and no change) if the
        free pages do not suffice. On success seq.num_computed is the number of cached tokens."""
        hits, hashes = self._match(seq)
        num_hit_free = sum(1 for p in hits if self.pages[p].ref_count == 0)
        if self.pages_needed(len(seq)) - len(hits) + num_hit_free > self.num_free:
            return False
        for page_id in hits:
            if self.pages[page_id].ref_count == 0:
                del self.free[page_id]
            self.pages[page_id].ref_count += 1
        seq.page_table = hits + [self._take() for _ in range(self.pages_needed(len(seq)) - len(hits))]
        seq.page_hashes = hashes
        seq.num_computed = len(hits) * self.page_size
        return True

    def can_append(self, seq: Sequence) -> bool:
        """Whether seq's next decode (keys at position len(seq) - 1) has or can get its page."""
        return (len(seq) - 1) // self.page_size < len(seq.page_table) or self.num_free > 0

    def append(self, seq: Sequence) -> None:
        if (len(seq) - 1) // self.page_size >= len(seq.page_table):
            seq.page_table.append(self._take())

    def cache_computed(self, seq: Sequence) -> None:
        """Enter seq's newly computed full pages into the prefix cache."""
        if not self.prefix_caching:
            return
        for i in range(len(seq.page_hashes), seq.num_computed // self.page_size):
            tokens = seq.token_ids[i * self.page_size : (i + 1) * self.page_size]
            seq.page_hashes.append(chain_hash(seq.page_hashes[-1] if seq.page_hashes else b"", tokens))
            page = self.pages[seq.page_table[i]]
            if seq.page_hashes[-1] not in self.cached:  # else an equal page is cached already; keep that one
                page.hash, page.tokens = seq.page_hashes[-1], tuple(tokens)
                self.cached[page.hash] = page.page_id

    def free_pages(self, seq: Sequence) -> None:
        """Release seq's pages; cached ones stay reusable until evicted, the tail of a chain first."""
        for page_id in reversed(seq.page_table):
            page = self.pages[page_id]
            page.ref_count -= 1
            if page.ref_count == 0:
                self.free[page_id] = None
                if page.hash is None:
                    self.free.move_to_end(page_id, last=False)
        seq.page_table, seq.page_hashes = [], []
