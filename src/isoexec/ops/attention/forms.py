"""The forms the attention-shaped probes (attention's, MLA's) run a batch of sequences in, and the paged store
their engine forms read.

Trainer cases run packed variable-length batches (in order, reversed, with strided inputs, and two subsets);
`engine_prefill` runs chunked prefill (chunks of one and two key blocks, 7, a block + 7, all at once; reversed;
pages of two blocks and of half a block) and `engine_decode` one token per sequence per step (staggered starts,
and lockstep in reverse), both over a store whose pages are handed out in shuffled order and whose unwritten
slots hold NaN/±inf until written, so a kernel that reads a slot a row does not see is caught. A probe supplies
how its op is called: `packed(case, order, non_contiguous)` and `steps(case, order, spans, page_size)`, each
giving {sequence index: output}.
"""

import torch
from torch import Tensor

from .metadata import UNUSED_SLOT, paged_slot_table

POISON = (float("nan"), float("inf"), float("-inf"))
# The page size (and the chunk unit) of the engine forms, in units of the impl's key block; impls without a
# block size (native) get this one.
DEFAULT_BLOCK_N = 16


def block_n(ctx) -> int:
    return ctx.constants.get("block_n", DEFAULT_BLOCK_N)


def prefill_spans(lengths: dict[int, int], order, chunk: int) -> list[list[tuple[int, int, int]]]:
    """Chunked prefill's steps: every sequence of `order` advances by `chunk` tokens a step, all in one
    batch; a step lists (sequence, start, stop) query ranges. `lengths`: sequence -> its length."""
    longest = max(lengths[i] for i in order)
    return [[(i, s, min(s + chunk, lengths[i])) for i in order if s < lengths[i]] for s in range(0, longest, chunk)]


def decode_spans(lengths: dict[int, int], order, stagger: int) -> list[list[tuple[int, int, int]]]:
    """Token-by-token decode's steps; sequence number n of `order` starts at step n * stagger."""
    starts = {i: n * stagger for n, i in enumerate(order)}
    last = max(starts[i] + lengths[i] for i in order)
    return [[(i, s - starts[i], s - starts[i] + 1) for i in order if 0 <= s - starts[i] < lengths[i]] for s in range(last)]


class PagedStore:
    """Per token the fields `shapes` names (field -> its shape past the token), in pages of `page_size` slots handed
    out to the sequences `order` in shuffled order, two spare pages nobody owns; poisoned until written."""

    def __init__(self, ctx, lengths: dict[int, int], order, page_size: int, shapes: dict[str, tuple[int, ...]]):
        pages_per_seq = [-(-lengths[i] // page_size) for i in order]
        num_pages = sum(pages_per_seq) + 2
        pages = torch.randperm(num_pages, generator=ctx.generator)
        block_table = torch.full((len(order), max(pages_per_seq)), UNUSED_SLOT, dtype=torch.int64)
        taken = 0
        for row, count in enumerate(pages_per_seq):
            block_table[row, :count] = pages[taken : taken + count]
            taken += count
        self.slot_table = paged_slot_table(block_table, page_size, block_table.shape[1] * page_size).to(ctx.device)  # [B, L]
        self.row = {i: row for row, i in enumerate(order)}
        self.fields = {}
        for name, shape in shapes.items():
            size = num_pages * page_size * torch.Size(shape).numel()
            poison = torch.tensor(POISON)[torch.arange(size) % len(POISON)]
            self.fields[name] = poison.reshape(num_pages * page_size, *shape).to(ctx.dtype).to(ctx.device)

    def write(self, seq, i: int, start: int, stop: int) -> None:
        """Sequence i's tokens [start, stop) into its slots, each field from the attribute of `seq` it is named by."""
        slots = self.slot_table[self.row[i], start:stop]
        for name, field in self.fields.items():
            field[slots] = getattr(seq, name)[start:stop]


def engine_steps(ctx, seqs, order, page_size, spans, shapes, call) -> dict[int, Tensor]:
    """One call a step over a `PagedStore` of `shapes`; `spans[step]` lists (i, start, stop): the query tokens of
    sequence i in that step, whose fields are written to the store just before. `call(store, step, seq_ids,
    positions)` runs the op on that step's queries; -> {sequence index: its outputs in token order}."""
    store = PagedStore(ctx, {i: len(seqs[i]) for i in order}, order, page_size, shapes)
    pieces = {i: [] for i in order}
    for step in spans:
        for i, start, stop in step:
            store.write(seqs[i], i, start, stop)
        seq_ids = torch.cat([torch.full((stop - start,), store.row[i]) for i, start, stop in step]).to(ctx.device)
        positions = torch.cat([torch.arange(start, stop) for i, start, stop in step]).to(ctx.device)
        out = call(store, step, seq_ids, positions)
        for (i, _, _), part in zip(step, out.split([stop - start for _, start, stop in step])):
            pieces[i].append(part)
    return {i: torch.cat(pieces[i]) for i in order}


def forms(ctx, case, lengths: dict[int, int], order, packed, steps, strided: str):
    """(label, run) for every form that `case` serves, each run giving {sequence index: output}; `strided` names the
    inputs `packed` makes non-contiguous."""
    n = block_n(ctx)
    if ctx.role[case] == "trainer":
        yield "packed", lambda: packed(case, order, False)
        yield "packed in reverse order", lambda: packed(case, order[::-1], False)
        yield f"packed, non-contiguous {strided}", lambda: packed(case, order, True)
        for part in (order[1::2], order[::2]):
            yield f"packed subset {[lengths[i] for i in part]}", lambda part=part: packed(case, part, False)
    elif case == "engine_decode":
        yield "decode, staggered starts", lambda: steps(case, order, decode_spans(lengths, order, 3), n)
        yield "decode in lockstep, reverse order", lambda: steps(case, order[::-1], decode_spans(lengths, order[::-1], 0), n)
    else:
        def prefill(part, chunk, page_size=n):
            return lambda: steps(case, part, prefill_spans(lengths, part, chunk), page_size)

        longest = max(lengths[i] for i in order)
        for chunk in dict.fromkeys((n, 2 * n, 7, n + 7, longest)):
            yield f"prefill in chunks of {chunk}", prefill(order, chunk)
        yield f"prefill in chunks of {n}, reverse order", prefill(order[::-1], n)
        yield f"prefill in chunks of 7, pages of {2 * n}", prefill(order, 7, 2 * n)
        # Pages smaller than a key block: a block's keys come from several pages, chunks start anywhere.
        small = max(1, n // 2)
        yield f"prefill in chunks of 5, pages of {small}", prefill(order, 5, small)


def alone(ctx, lengths: dict[int, int], i: int, packed, steps) -> Tensor:
    """Sequence i computed by itself in the anchor case's simplest form: the reference every form's rows meet."""
    case = ctx.anchor
    if ctx.role[case] == "trainer":
        return packed(case, [i], False)[i]
    spans = decode_spans(lengths, [i], 0) if case == "engine_decode" else prefill_spans(lengths, [i], lengths[i])
    return steps(case, [i], spans, block_n(ctx))[i]
