"""The ordinary batch sampler: softmax, torch.topk / sort + cumsum filters and torch.multinomial with one
generator per batch, seeded from the batch's first request — so a row's token depends on its batch."""

import torch
from torch import Tensor

from ..common import expect_dtype


def _top_k(logits: Tensor, top_k: Tensor) -> Tensor:
    vocab_size = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab_size), vocab_size)  # [R]
    kth = torch.topk(logits, vocab_size, dim=-1).values.gather(-1, (k - 1).unsqueeze(-1))  # [R, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(probs: Tensor, top_p: Tensor) -> Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [R, V]
    remove_sorted = sorted_probs.cumsum(-1) - sorted_probs >= top_p.unsqueeze(-1)
    remove_sorted[..., 0] = False  # keep at least the most likely token
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return probs.masked_fill(remove, 0.0)


def sample(logprobs: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, position: Tensor, *,
           input_dtype: str, may_filter: bool = True) -> Tensor:
    """logprobs [R, V] -> [R] int64; `position` is ignored, as a batch sampler does, and so is `may_filter`
    (`sampling.triton`'s hint)."""
    expect_dtype(logprobs, input_dtype, "sampling input")
    if logprobs.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=logprobs.device)
    logits = logprobs.float()
    is_greedy = temperature <= 0
    logits = logits / torch.where(is_greedy, 1.0, temperature.float()).unsqueeze(-1)
    probs = _top_p(torch.softmax(_top_k(logits, top_k), dim=-1), top_p.float())
    generator = torch.Generator(device=logprobs.device).manual_seed(int(seed[0]))
    drawn = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return torch.where(is_greedy, logits.argmax(-1), drawn)
