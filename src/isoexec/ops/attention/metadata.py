"""Integer metadata that turns every execution form into the one call `attention` takes.

A form is described by three integer tensors: `slot_table` [B, L] (row of the key/value store holding
key position j of sequence b), `seq_ids` [T] (the table row of each query) and `positions` [T] (each
query's absolute position). Packed training batches and paged KV caches differ only here, so the float
arithmetic of the op is the same in every case. Everything below is integer indexing: exact.
"""

import torch
from torch import Tensor

UNUSED_SLOT = -1


def packed_slot_table(cu_seqlens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Metadata for sequences packed back to back (k_store is the packed keys themselves).

    cu_seqlens [B + 1] int64 (cumulative lengths, starting at 0) -> slot_table [B, max_len] (key j of
    sequence b lives at row cu_seqlens[b] + j; UNUSED_SLOT past its end), seq_ids [T], positions [T].
    """
    cu_seqlens = cu_seqlens.to(torch.int64)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]  # [B]
    num_seqs = lengths.shape[0]
    max_len = int(lengths.max()) if num_seqs else 0
    j = torch.arange(max_len, device=cu_seqlens.device)  # [L]
    slot_table = torch.where(j < lengths[:, None], cu_seqlens[:-1, None] + j, UNUSED_SLOT)  # [B, L]
    seq_ids = torch.repeat_interleave(torch.arange(num_seqs, device=cu_seqlens.device), lengths)  # [T]
    positions = torch.arange(seq_ids.shape[0], device=cu_seqlens.device) - cu_seqlens[seq_ids]  # [T]
    return slot_table, seq_ids, positions


def paged_slot_table(block_table: Tensor, page_size: int, num_keys: int) -> Tensor:
    """Slots of keys 0 … num_keys - 1 for a page table block_table [B, P] -> slot_table [B, num_keys].

    slot = block_table[b, j // page_size] * page_size + j % page_size; a negative page (unallocated)
    or a key past the table gives UNUSED_SLOT.
    """
    num_pages = -(-num_keys // page_size)
    pages = block_table[:, :num_pages]  # [B, ≤ num_pages]
    if pages.shape[1] < num_pages:
        pad = pages.new_full((pages.shape[0], num_pages - pages.shape[1]), UNUSED_SLOT)
        pages = torch.cat([pages, pad], dim=1)
    pages = pages.repeat_interleave(page_size, dim=1)[:, :num_keys]  # [B, L]
    offsets = torch.arange(num_keys, device=block_table.device) % page_size  # [L]
    return torch.where(pages >= 0, pages * page_size + offsets, UNUSED_SLOT)
