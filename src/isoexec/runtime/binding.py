"""Binding a contract for a model: what a runner (the engine's, the trainer's) holds and calls.

A runner binds once, for its cases, and keeps the `Binding`: each (region, case)'s impl and the
constants it was bound with, and each case's ops ready to call. Its fingerprint is taken from exactly
this (`Binding.installed`), so the handshake sees what the runner calls, not a second resolution.
"""

import functools
from dataclasses import dataclass
from typing import Callable

from ..contract.schema import Contract
from ..contract.values import ContractError
from .registry import REGISTRY, Impl, Registry


@dataclass(frozen=True)
class Binding:
    contract: Contract
    cases: tuple[str, ...]
    installed: dict[tuple[str, str], Impl]  # (region, case) -> the impl bound there
    ops: dict[str, dict[str, Callable]]  # case -> contract op -> the impl with its constants applied


def _add_then_norm(add, norm):
    """A plain norm in the model's fused shape: `add` then `norm`, called one after the other as if unfused."""

    def rms_norm_residual(x, residual, weight, eps, zero_centered=False):
        s = x if residual is None else add(x, residual)
        return norm(s, weight, eps, zero_centered), s

    return rms_norm_residual


# Projections of one input that a model calls together (`model/layers/params.project`): where the contract
# pins every one of a group to one impl with the same constants and the impl can join them, the case also
# gets the group's joined op, one call over the weights the model keeps joined (`ops/linear/joined.py`).
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("in_proj_qkv", "in_proj_z"), ("in_proj_b", "in_proj_a"),
            ("q_a_proj", "kv_a_proj_with_mqa"), ("q_proj", "kv_a_proj_with_mqa"))


def joined_name(names) -> str:
    return "+".join(names)


def _joined_ops(cells: dict) -> dict[str, Callable]:
    from ..ops.linear.joined import joined_op

    out = {}
    for names in SIBLINGS:
        if not all(name in cells for name in names):
            continue
        (impl, entry), *rest = (cells[name] for name in names)
        if impl.joined is None or any(other is not impl or dict(e.constants) != dict(entry.constants) for other, e in rest):
            continue
        forward, can_join = impl.joined
        constants = dict(entry.constants)
        out[joined_name(names)] = joined_op(functools.partial(forward, **constants), functools.partial(can_join, **constants))
    return out


# q_norm, k_norm and rotary_emb as one launch with each output's bits (`ops/rope/qk_triton.py`), offered where
# the contract pins rotary_emb to rope.triton and q_norm and k_norm, if pinned, to rms_norm.triton with one set
# of constants; the layer falls back to the separate ops where the launch declines.
QK_NORM_ROPE = joined_name(("q_norm", "k_norm", "rotary_emb"))


def _qk_norm_rope(cells: dict) -> dict[str, Callable]:
    rope = cells.get("rotary_emb")
    if rope is None or rope[0].id != "rope.triton":
        return {}
    norms = [cells[name] for name in ("q_norm", "k_norm") if name in cells]
    norm = None
    if len(norms) == 2 and all(impl.id == "rms_norm.triton" for impl, _ in norms) and dict(norms[0][1].constants) == dict(norms[1][1].constants):
        norm = dict(norms[0][1].constants)
    from ..ops.rope.qk_triton import qk_norm_rope

    return {QK_NORM_ROPE: functools.partial(qk_norm_rope, norm=norm, rope=dict(rope[1].constants))}


def composed_norms(contract: Contract, spec, cases) -> set[str]:
    """The norms after a residual add that `contract` pins in plain `rms_norm` in any of `cases`: `bind`
    composes each with the contract's `residual_add` op."""
    return {op for entry in contract.composition if entry.region == "rms_norm" and not set(entry.cases).isdisjoint(cases)
            for op in entry.ops if op in spec.residual_norm_ops}


def model_ops(contract: Contract, spec, cases) -> frozenset[str]:
    """The ops the model needs `contract` to pin in `cases`: its own, and `residual_add` where a norm is composed."""
    return spec.ops | ({"residual_add"} if composed_norms(contract, spec, cases) else set())


def bind(contract: Contract, spec, cases, registry: Registry = REGISTRY) -> Binding:
    """Bind `contract`'s ops for the model `spec` in each of `cases`; refuses a contract that leaves one of
    the model's ops unpinned.

    The norms after a residual add are called as (x, residual) -> (y, x + residual): an op pinned in
    `rms_norm.residual` is that already; one pinned in plain `rms_norm` is composed with `residual_add`."""
    cases = (cases,) if isinstance(cases, str) else tuple(cases)
    installed = registry.resolve(contract, cases)
    ops = {}
    for case in cases:
        cells = {op: (installed[region, c], entry) for region, c, entry in contract.cells() if c == case for op in entry.ops}
        bound = {op: impl.bind(entry.constants) for op, (impl, entry) in cells.items()}
        needed = model_ops(contract, spec, [case]) - ({"sample"} if contract.cases[case].role == "trainer" else set())
        missing = sorted(needed - set(bound))
        if missing:
            raise ContractError("composition", f"contract {contract.name} does not pin op(s) {', '.join(missing)} for case {case}, "
                                f"which {spec.architecture} calls")
        for op in composed_norms(contract, spec, [case]):
            bound[op] = _add_then_norm(bound["residual_add"], bound[op])
        bound.update(_joined_ops(cells))
        bound.update(_qk_norm_rope(cells))
        ops[case] = bound
    return Binding(contract, cases, installed, ops)
