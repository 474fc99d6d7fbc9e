"""The gradients of a packed causal attention from flash's backward kernel, given the forward's own output
and log-sum-exp: what attention.triton's backward runs for the trainer's packed batches, so that the
backward does not first run a second (flash) forward to rebuild what the Triton forward already had.

Gradients must be correct, not batch-invariant. Flash's backward takes the probabilities as exp(s - lse)
from the lse it is given and D = rowsum(dO ∘ O) from the output it is given: both come from the Triton
forward, whose output differs from flash's by bf16 rounding only, so the gradients are flash's to within
that (tests/ops/attention/test_triton.py compares them with float64 on a GPU).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.cache
def _flash(device: torch.device) -> tuple[bool, Tensor, Tensor] | None:
    """(lse unpadded, rng_state, unused) as this torch's varlen flash kernels give them on `device`, from one
    forward over two tiny sequences: the lse is [H, T] (unpadded) in some builds and [B, H, max_q] in others.
    None where torch has no flash kernels for the device."""
    try:
        q = torch.zeros(3, 1, 64, device=device, dtype=torch.bfloat16)
        cu = torch.tensor([0, 1, 3], device=device, dtype=torch.int32)
        _, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(q, q, q, cu, cu, 2, 2, 0.0, True, False)
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return lse.dim() == 2, rng_state, unused


def fits(q: Tensor, k_store: Tensor, out_dtype: torch.dtype, window: int | None, packed_len: int | None) -> bool:
    """Whether a packed batch's backward can run on flash: a non-empty batch of whole causal sequences (no
    window), fp16 or bf16 throughout, a head size flash takes, an sm_80+ GPU with torch's flash kernels."""
    return (packed_len is not None and window is None and q.shape[0] > 0 and q.is_cuda
            and q.dtype in (torch.float16, torch.bfloat16) and k_store.dtype == q.dtype and out_dtype == q.dtype
            and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
            and torch.cuda.get_device_capability(q.device) >= (8, 0) and _flash(q.device) is not None)


def grads(grad: Tensor, q: Tensor, k_store: Tensor, v_store: Tensor, out: Tensor, lse: Tensor, slot_table: Tensor,
          seq_ids: Tensor, positions: Tensor, scale: float, longest: int) -> tuple[Tensor, Tensor, Tensor]:
    """dq [T, H, D], dk and dv [T, Hkv, D] of a packed batch (`metadata.packed_slot_table`: key j of sequence b
    is row cu_seqlens[b] + j, the queries the same rows), from its output `out` and `lse` [H, T] float32."""
    unpadded, rng_state, unused = _flash(q.device)
    cu = torch.nn.functional.pad((slot_table >= 0).sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
    if not unpadded:
        padded = lse.new_full((slot_table.shape[0], lse.shape[0], longest), float("inf"))
        padded[seq_ids, :, positions] = lse.t()
        lse = padded
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        grad.contiguous(), q.contiguous(), k_store.contiguous(), v_store.contiguous(), out, lse, cu, cu, longest, longest,
        0.0, True, rng_state, unused, scale=scale)
    return dq, dk, dv
