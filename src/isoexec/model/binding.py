"""Fitting a family contract to one model, and binding its ops for a case."""

import dataclasses

from ..contract.schema import Contract, Entry, Model
from ..runtime.registry import REGISTRY, Registry
from ..validate.battery import BOUNDARY_CONSTANTS
from .spec import ModelSpec


def fit_contract(contract: Contract, spec: ModelSpec, profile: str | None = None) -> Contract:
    """The family contract as this model runs it: its architecture, only the ops it has, and its
    parameter dtype at the op boundaries. Every change shows in the identities."""
    boundary = next((e.constants[k] for e in contract.composition for k in BOUNDARY_CONSTANTS if k in e.constants), spec.dtype)
    entries = []
    for entry in contract.composition:
        ops = [op for op in entry.ops if op in spec.ops]
        if not ops:
            continue
        constants = {k: (spec.dtype if k in BOUNDARY_CONSTANTS and v == boundary else v) for k, v in entry.constants.items()}
        entries.append(dataclasses.replace(entry, ops=ops, constants=constants))
    model = Model(family=contract.model.family, architecture=spec.architecture, profile=profile or contract.model.profile)
    return dataclasses.replace(contract, model=model, composition=tuple(Entry(**e.__dict__) for e in entries))


def bind(contract: Contract, spec: ModelSpec, case: str, registry: Registry = REGISTRY) -> dict:
    """The bound ops of `case`; refuses a contract that leaves one of the model's ops unpinned."""
    from .. import ops  # noqa: F401  (registers the op families)

    bound = registry.bind_ops(contract, case)
    needed = spec.ops - ({"sample"} if contract.cases[case].role == "trainer" else set())
    missing = sorted(needed - set(bound))
    if missing:
        raise ValueError(f"contract {contract.name} does not pin op(s) {', '.join(missing)} for case {case}")
    return bound
