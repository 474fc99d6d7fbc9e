"""Gated DeltaNet's depthwise causal convolution: y[t] = silu(Σ_w weight[:, w] · x_at(p_t - (W-1) + w)).

Tokens of one sequence sit back to back with consecutive absolute positions: a run. With a cache
(`conv_state` [N, W-1, D], one slot per sequence, `state_ids` [T] naming each token's slot) a run is a
stretch of consecutive tokens with the same slot; slot n holds the W-1 inputs before the run's first
token p0, `conv_state[n, W-1-d]` being the input at p0-d. Without a cache (the trainer) every run must
start at position 0, `state_ids` may be None, and runs are split wherever the position does not grow
by exactly 1 (or the slot changes, when state_ids are given). Inputs at negative positions are zero,
chosen by `torch.where`, so a slot that was never written (NaN) cannot leak into a run starting at 0.
After the call each run's slot holds the last W-1 inputs up to its last token, written in place.

`causal_conv` (the reference) makes an output row a function of its own W inputs and the weight
alone: the inputs are gathered per lag, in the input dtype, from x or the slot, so a prefill chunk, a
decode step and a packed training batch feed identical values into identical arithmetic — products
in the accumulation dtype summed over w ascending by separate elementwise multiplies and adds, then
silu as z / (1 + exp(-z)) (torch.sigmoid and F.silu round differently in their vector tails on CPU,
see docs/experiments.md) and one rounding to the output dtype.

`native_causal_conv` is what transformers and vLLM run: F.conv1d over each run of several tokens,
the multiply-and-sum update form for a single-token run, both in the weight dtype. The two forms
round differently, so decode and prefill disagree; it is the baseline the bitwise checks must see fail.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import expect_dtype, torch_dtype
from .runs import find_runs


def _check_inputs(x, weight, conv_state, state_ids, positions, input_dtype, weight_dtype):
    """Shapes and dtypes (the values' checks are `check_runs`', from the host's copy of the runs)."""
    expect_dtype(x, input_dtype, "gdn.conv input")
    expect_dtype(weight, weight_dtype, "gdn.conv weight")
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[1] or weight.shape[1] < 1:
        raise ValueError(f"gdn.conv: x must be [T, D] and weight [D, W], got {tuple(x.shape)} and {tuple(weight.shape)}")
    num_tokens, width = x.shape[0], weight.shape[1]
    ids = [("positions", positions)] + ([] if state_ids is None else [("state_ids", state_ids)])
    for name, t in ids:
        if t.dim() != 1 or t.shape[0] != num_tokens or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"gdn.conv: {name} must be a [{num_tokens}] integer tensor, got {t.dtype} of shape {tuple(t.shape)}")
    if conv_state is None:
        return
    expect_dtype(conv_state, input_dtype, "gdn.conv conv_state")
    if conv_state.dim() != 3 or conv_state.shape[1:] != (width - 1, x.shape[1]):
        raise ValueError(f"gdn.conv: conv_state must be [N, {width - 1}, {x.shape[1]}], got {tuple(conv_state.shape)}")
    if state_ids is None:
        raise ValueError("gdn.conv: state_ids are required with a conv_state")


def check_runs(runs, conv_state) -> None:
    """The value checks of a call, from its `runs.find_runs` (None while a CUDA graph is captured: none)."""
    if runs is None:
        return
    if runs.min_position < 0:
        raise ValueError(f"gdn.conv: positions must be non-negative, got {runs.min_position}")
    if conv_state is not None and runs.slots is not None and not 0 <= runs.slots[0] <= runs.slots[1] < conv_state.shape[0]:
        raise ValueError(f"gdn.conv: state_ids must lie in [0, {conv_state.shape[0]}), got [{runs.slots[0]}, {runs.slots[1]}]")
    if conv_state is not None and runs.slot_jumps:
        raise ValueError("gdn.conv: consecutive tokens of one slot must have consecutive positions")
    if conv_state is None and runs.first_positions.any():
        raise ValueError(f"gdn.conv: without conv_state every run must start at position 0, got one at {int(runs.first_positions.max())}")
    if conv_state is not None and runs.slot_in_two_runs:
        raise ValueError("gdn.conv: a slot appears in two runs of one call")


def _runs(state_ids: Tensor | None, positions: Tensor, with_last: bool) -> tuple[Tensor, Tensor | None]:
    """-> (offset [T]: the token's place in its run, last [R]: each run's last token, None unless `with_last`:
    its nonzero is a host read). Inputs checked by `check_runs`."""
    num_tokens = positions.shape[0]
    if num_tokens == 0:
        empty = positions.new_zeros(0)
        return empty, empty
    starts = torch.ones(num_tokens, dtype=torch.bool, device=positions.device)
    if num_tokens > 1:
        jump = positions[1:] != positions[:-1] + 1
        starts[1:] = jump if state_ids is None else jump | (state_ids[1:] != state_ids[:-1])
    index = torch.arange(num_tokens, device=positions.device)
    offset = index - torch.where(starts, index, 0).cummax(0).values
    if not with_last:
        return offset, None
    return offset, torch.cat([starts[1:], starts.new_ones(1)]).nonzero().squeeze(1)


def _input_at(x: Tensor, conv_state: Tensor | None, state_ids: Tensor | None, positions: Tensor, offset: Tensor, rows: Tensor,
              lag: int) -> Tensor:
    """The input at position p_t - lag for each token t of `rows` [R] -> [R, D], from x when it is in the
    token's run, else from its slot, else (a negative position) zero."""
    if lag == 0:
        return x[rows]
    in_run = (offset[rows] >= lag)[:, None]  # [R, 1]
    from_x = x[(rows - lag).clamp(min=0)]
    if conv_state is None:
        return torch.where(in_run, from_x, x.new_zeros(()))
    before = conv_state.shape[1] - lag + offset[rows]  # slot column of position p_t - lag, valid where not in_run
    from_state = conv_state[state_ids[rows], before.clamp(0, conv_state.shape[1] - 1)]
    negative = (positions[rows] < lag)[:, None]
    return torch.where(in_run, from_x, torch.where(negative, x.new_zeros(()), from_state))


def _write_state(x, conv_state, state_ids, positions, offset, last) -> None:
    """Each run's slot <- the last W-1 inputs up to the run's last token (read before anything is written)."""
    if conv_state is None:
        return
    width = conv_state.shape[1] + 1
    columns = [_input_at(x, conv_state, state_ids, positions, offset, last, lag) for lag in range(width - 2, -1, -1)]
    if columns:
        conv_state[state_ids[last]] = torch.stack(columns, 1).detach()


def causal_conv(x: Tensor, weight: Tensor, conv_state: Tensor | None, state_ids: Tensor | None, positions: Tensor, *, input_dtype: str,
                output_dtype: str, weight_dtype: str, accum_dtype: str) -> Tensor:
    """x [T, D], weight [D, W], conv_state [N, W-1, D] or None, state_ids [T] or None, positions [T] -> [T, D]."""
    _check_inputs(x, weight, conv_state, state_ids, positions, input_dtype, weight_dtype)
    check_runs(find_runs(positions, state_ids), conv_state)
    return conv_rows(x, weight, conv_state, state_ids, positions, accum_dtype, output_dtype)


def conv_rows(x: Tensor, weight: Tensor, conv_state: Tensor | None, state_ids: Tensor | None, positions: Tensor, accum_dtype: str,
              output_dtype: str) -> Tensor:
    """causal_conv after its input checks (without a conv_state, no host reads: gdn.conv.triton's backward
    recomputes through it)."""
    accum = torch_dtype(accum_dtype)
    width = weight.shape[1]
    offset, last = _runs(state_ids, positions, conv_state is not None)
    rows = torch.arange(x.shape[0], device=x.device)
    weight_f = weight.to(accum)
    acc = None
    for w in range(width):
        product = weight_f[:, w] * _input_at(x, conv_state, state_ids, positions, offset, rows, width - 1 - w).to(accum)
        acc = product if acc is None else acc + product
    _write_state(x, conv_state, state_ids, positions, offset, last)
    return (acc / (1.0 + (-acc).exp())).to(torch_dtype(output_dtype))


def native_causal_conv(x: Tensor, weight: Tensor, conv_state: Tensor | None, state_ids: Tensor | None, positions: Tensor, *,
                       input_dtype: str, output_dtype: str, weight_dtype: str, accum_dtype: str) -> Tensor:
    """The reference's signature; the backend picks its own accumulation, so `accum_dtype` is unused."""
    _check_inputs(x, weight, conv_state, state_ids, positions, input_dtype, weight_dtype)
    check_runs(find_runs(positions, state_ids), conv_state)
    num_dims, width = weight.shape
    offset, last = _runs(state_ids, positions, with_last=True)
    y = torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    first = last - offset[last]
    lengths = (offset[last] + 1).tolist()
    singles = last[offset[last] == 0]
    if singles.numel():
        window = torch.stack([_input_at(x, conv_state, state_ids, positions, offset, singles, lag) for lag in range(width - 1, -1, -1)], -1)
        y[singles] = F.silu((window.to(weight.dtype) * weight).sum(-1))  # [R, D, W] -> [R, D]
    for start, length in zip(first.tolist(), lengths):
        if length == 1:
            continue
        rows = torch.tensor([start], device=x.device)
        previous = [_input_at(x, conv_state, state_ids, positions, offset, rows, lag) for lag in range(width - 1, 0, -1)]
        padded = torch.cat([*previous, x[start : start + length]]).to(weight.dtype)  # [W-1+L, D]
        y[start : start + length] = F.silu(F.conv1d(padded.T[None], weight[:, None], groups=num_dims))[0].T
    _write_state(x, conv_state, state_ids, positions, offset, last)
    return y.to(torch_dtype(output_dtype))
