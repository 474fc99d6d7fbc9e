"""The negative controls of the bitwise tests: reference ops made batch-dependent on purpose.

A bitwise test must be seen to fail on a path that breaks invariance, or it proves nothing. The native
fast path cannot be that control: whether a CPU's GEMM, SDPA or norm kernel gives a row other bits in a
batch is a property of the library build and the CPU model (torch's fp32 GEMM is batch-dependent on an
AVX-512 machine and was invariant on an AMD AVX2 one), so a test asking native to differ passes on one
machine and fails on the next. Each control here is a reference op whose reduction order follows the
number of rows in the call, as a fast library's does (split-K and key tiles chosen from M). It is built
from the reference's own elementwise operations, so the difference is one of arithmetic, not of a
library build: it shows on every machine.

Importing this module registers the controls with `runtime.REGISTRY` (ids `control.*`, beside the
built-in impls), so contracts can pin them like any impl; `control_contract` builds one for the engine,
trainer and audit tests.
"""

import copy
import math

import torch

from conftest import preset_dict
from isoexec.contract import Contract
from isoexec.ops.activation import reference as activation
from isoexec.ops.attention import reference as attention
from isoexec.ops.common import ALL_CASES, torch_dtype
from isoexec.ops.linear import reference as linear
from isoexec.ops.logprobs import reference as logprobs
from isoexec.ops.moe import reference as moe
from isoexec.ops.rms_norm import reference as rms_norm
from isoexec.runtime.registry import REGISTRY, Impl

# By default a call of at most this many rows takes the "small batch" order: decode steps and short
# prefill chunks do, the trainer's packed micro-batches and the battery's larger batches do not. Each
# control takes it as a constant, `small_rows`, so a test can place the switch where it must be seen.
SMALL = 16


def _rows(t: torch.Tensor) -> int:
    return math.prod(t.shape[:-1])


def split_k_linear(x, weight, bias=None, *, small_rows=SMALL, **constants):
    """linear.reference, except that a call of at most `small_rows` rows splits K in two halves, each summed
    and rounded to the output dtype, then added (split-K, as GEMM libraries pick it to fill the machine
    at small M, with its partials in the output dtype): one rounding more, and blocks
    (b0 + b1) + (b2 + b3) instead of ((b0 + b1) + b2) + b3."""
    if _rows(x) > small_rows:
        return linear.linear(x, weight, bias, **constants)
    half = x.shape[-1] // 2
    low = linear.linear(x[..., :half], weight[:, :half], None, **constants)
    high = linear.linear(x[..., half:], weight[:, half:], bias, **constants)
    accum = torch_dtype(constants["accum_dtype"])
    return (low.to(accum) + high.to(accum)).to(low.dtype)


def other_leaf_cut_row_parallel(x, weight, bias=None, *, num_leaves, small_rows=8, **constants):
    """linear.row_parallel.reference, except that a call of at most `small_rows` rows at a K the
    leaves do not divide cuts them as if K had one more (zero) column in front: the same sum, other
    leaves. Where G divides K it is the reference, so only probes at such K can catch it."""
    k = x.shape[-1]
    if k % num_leaves == 0 or not 0 < _rows(x) <= small_rows:
        return linear.row_parallel_linear(x, weight, bias, num_leaves=num_leaves, **constants)
    pad = lambda t: torch.cat([t.new_zeros(*t.shape[:-1], 1), t], -1)  # noqa: E731
    return linear.row_parallel_linear(pad(x), pad(weight), bias, num_leaves=num_leaves, **constants)


def key_block_attention(q, k_store, v_store, slot_table, seq_ids, positions, scale, window=None, packed_len=None, *, block_n,
                        small_rows=SMALL, **constants):
    """attention.reference walking keys in blocks twice as wide for more than `small_rows` queries (a prefill
    kernel with wider key tiles than the decode kernel): the online softmax rescales at other points."""
    block_n = block_n * 2 if q.shape[0] > small_rows else block_n
    return attention.attention(q, k_store, v_store, slot_table, seq_ids, positions, scale, window, packed_len, block_n=block_n, **constants)


def row_count_rms_norm(x, weight, eps, zero_centered=False, *, reduce_block, small_rows=SMALL, **constants):
    """rms_norm.reference reducing each row's squares in blocks half as wide in calls of at most `small_rows` rows."""
    reduce_block = max(1, reduce_block // 2) if _rows(x) <= small_rows else reduce_block
    return rms_norm.rms_norm(x, weight, eps, zero_centered, reduce_block=reduce_block, **constants)


def row_count_logprobs(logits, *, vocab_block, small_rows=SMALL, **constants):
    """logprobs.reference summing exp over vocabulary blocks half as wide in calls of at most `small_rows` rows."""
    vocab_block = max(1, vocab_block // 2) if _rows(logits) <= small_rows else vocab_block
    return logprobs.logprobs(logits, vocab_block=vocab_block, **constants)


VECTOR_WIDTH = 16  # fp32 lanes of an AVX-512 register


def vector_tail_silu_mul(gate, up, *, input_dtype, output_dtype, compute_dtype):
    """activation.reference, except that the scalar tail of the flattened call (its last numel % 16
    elements) is computed in float64 and rounded once: a vectorised body and a scalar tail that round
    differently, as torch's CPU sigmoid does. Which elements fall in the tail moves with the batch."""
    out = activation.silu_mul(gate, up, input_dtype=input_dtype, output_dtype=output_dtype, compute_dtype=compute_dtype)
    tail = gate.numel() % VECTOR_WIDTH
    if tail == 0:
        return out
    g, u = gate.reshape(-1)[-tail:].double(), up.reshape(-1)[-tail:].double()
    flat = out.reshape(-1).clone()
    flat[-tail:] = (g / (1.0 + (-g).exp()) * u).to(out.dtype)
    return flat.reshape(out.shape)


def row_count_moe_experts(x, ids, gate_up, down, *, block_k, small_rows=SMALL, **constants):
    """moe.experts.reference walking K in blocks twice as long for calls of more than `small_rows`
    tokens (a grouped GEMM whose tile follows the batch): each routed row's sums regroup."""
    return moe.experts(x, ids, gate_up, down, block_k=block_k * 2 if x.shape[0] > small_rows else block_k, **constants)


def reversed_scan_moe_router(x, weight, bias, *args, small_rows=SMALL, **constants):
    """moe.router.reference walking the experts in reverse order in calls of more than `small_rows`
    tokens (a top-k kernel whose scan order follows its tiling): equal scores at the top-k boundary go
    to the higher expert id (and the softmax's sum may regroup). A model with tied gate rows
    (`tie_gate_rows`) is routed differently by call size."""
    if x.shape[0] <= small_rows:
        return moe.router(x, weight, bias, *args, **constants)
    weights, ids = moe.router(x, weight.flip(0), None if bias is None else bias.flip(0), *args, **constants)
    return weights, weight.shape[0] - 1 - ids


def tie_gate_rows(model, a: int = 1, b: int = 3):
    """`model` with experts a and b sharing one gate row in every MoE layer (in place): every token scores
    them exactly alike, so wherever they straddle the top-k boundary only the tie order picks one."""
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight[b] = layer.mlp.gate.weight[a]
    return model


def control_moe_experts(data: dict, small_rows: int | None = None) -> dict:
    """A contract dict (of an MoE preset) with `moe.experts` pinned to its control, claiming nothing."""
    data = copy.deepcopy(data)
    data["name"] = f"{data['name']}-control-moe-experts"
    for entry in data["composition"]:
        if entry["region"] == "moe.experts":
            entry["impl"] = {"id": CONTROLS["moe.experts"].id, "version": 1}
            if small_rows is not None:
                entry["constants"]["small_rows"] = small_rows
        entry["discharge"] = {"method": "none"}
    data["claims"] = {"tolerances": {}}
    return data


def reordered_joined_linear(x, weight, bias, widths, *, block_k, **constants):
    """linear.reference's joined call (`ops/linear/joined.py`) summing K in blocks twice as long: the
    sibling projections' outputs regroup their sums when run as one call, so a model's rows differ
    between joined and apart weights."""
    return [part.contiguous() for part in linear.linear(x, weight, bias, block_k=2 * block_k, **constants).split(widths, dim=-1)]


# Pinned in place of linear.reference by tests of the joined path (same fn, another joined forward).
JOINED_CONTROL = Impl(id="control.reordered_joined_linear", version=1, region="linear", cases=ALL_CASES, fn=linear.linear,
                      joined=(reordered_joined_linear, linear.can_join))

CONTROLS = {
    "linear": Impl(id="control.split_k_linear", version=1, region="linear", cases=ALL_CASES, fn=split_k_linear),
    "linear.row_parallel": Impl(id="control.other_leaf_cut_row_parallel", version=1, region="linear.row_parallel", cases=ALL_CASES,
                                fn=other_leaf_cut_row_parallel),
    "attention": Impl(id="control.key_block_attention", version=1, region="attention", cases=ALL_CASES, fn=key_block_attention),
    "rms_norm": Impl(id="control.row_count_rms_norm", version=1, region="rms_norm", cases=ALL_CASES, fn=row_count_rms_norm),
    "logprobs": Impl(id="control.row_count_logprobs", version=1, region="logprobs", cases=ALL_CASES, fn=row_count_logprobs),
    "activation": Impl(id="control.vector_tail_silu_mul", version=1, region="activation", cases=ALL_CASES, fn=vector_tail_silu_mul),
    "moe.experts": Impl(id="control.row_count_moe_experts", version=1, region="moe.experts", cases=ALL_CASES, fn=row_count_moe_experts),
    "moe.router": Impl(id="control.reversed_scan_moe_router", version=1, region="moe.router", cases=ALL_CASES, fn=reversed_scan_moe_router),
}
for _impl in (*CONTROLS.values(), JOINED_CONTROL):
    if REGISTRY.get(_impl.id, _impl.version) is None:
        REGISTRY.register(_impl)


def control_dict(regions: str | tuple[str, ...] = "linear", preset: str = "tiny-dense", small_rows: int | None = None) -> dict:
    """A preset's dict with the entries of `regions` pinning their controls (with `small_rows` where
    given), claiming nothing (like `native`)."""
    regions = (regions,) if isinstance(regions, str) else tuple(regions)
    data = copy.deepcopy(preset_dict(preset))
    data["name"] = f"{preset}-control-" + "-".join(regions)
    data["description"] = f"{preset} with a batch-dependent {', '.join(regions)}: the bitwise tests' negative control"
    for entry in data["composition"]:
        if entry["region"] in regions:
            impl = CONTROLS[entry["region"]]
            entry["impl"] = {"id": impl.id, "version": impl.version}
            if small_rows is not None:
                entry["constants"]["small_rows"] = small_rows
        entry["discharge"] = {"method": "none"}
    data["claims"] = {"tolerances": {}}
    return data


def control_contract(regions: str | tuple[str, ...] = "linear", preset: str = "tiny-dense", small_rows: int | None = None) -> Contract:
    return Contract.from_dict(control_dict(regions, preset, small_rows))
