"""Fitting a family contract to one model on one device arch.

The fitted contract names the model's architecture, keeps only the ops the model has, takes the
model's parameter dtype at the op boundaries, and takes the kernel constants each op family's tuning
rule gives the model's shapes on that arch (`Impl.tune`: GEMM tiles by (N, K), row kernels by row
width, MoE and MLA tiles by layer shape; never chosen from the batch). Where a family has no rule for the
arch, its entries keep the contract's portable constants, and the fitted contract's description says so. Every change of
constants shows in the identities.
"""

import dataclasses
import logging

from .schema import Contract, Entry, Model
from .vocabulary import BOUNDARY_CONSTANTS

log = logging.getLogger(__name__)


def arch_of(device) -> str:
    """The arch a device computes with, as the fingerprint records it (`sm_90`, `x86_64`, …)."""
    from ..runtime.fingerprint import device_info

    return device_info(device)["arch"]


def fit_contract(contract: Contract, spec, *, device="cpu", arch: str | None = None, profile: str | None = None, registry=None) -> Contract:
    """`contract` as the model `spec` runs it on `device` (or on `arch`, where given)."""
    from ..runtime.binding import model_ops
    from ..runtime.registry import REGISTRY

    registry = REGISTRY if registry is None else registry
    arch = arch_of(device) if arch is None else arch
    needed = model_ops(contract, spec, contract.cases)
    boundary = next((e.constants[k] for e in contract.composition for k in BOUNDARY_CONSTANTS if k in e.constants), spec.dtype)
    entries, untuned = [], []
    for entry in contract.composition:
        ops = [op for op in entry.ops if op in needed]
        if not ops:
            continue
        constants = {k: (spec.dtype if k in BOUNDARY_CONSTANTS and v == boundary else v) for k, v in entry.constants.items()}
        entry = dataclasses.replace(entry, ops=ops, constants=constants)
        impl = registry.get(entry.impl.id, entry.impl.version)
        tuned = impl.tune(ops, list(entry.cases), spec, arch) if impl is not None and impl.tune is not None else [(list(entry.cases), {})]
        if tuned is None:
            untuned.append(entry.impl.id)
            tuned = [(list(entry.cases), {})]
        entries += [dataclasses.replace(entry, cases=cases, constants={**entry.constants, **changes}) for cases, changes in tuned]
    _check_geometry(entries, spec, registry)
    model = Model(family=spec.family, architecture=spec.architecture, profile=profile or contract.model.profile)
    description = contract.description
    if untuned:
        note = f"no {arch} tuning rules for {', '.join(sorted(set(untuned)))}: portable constants kept"
        log.info("contract %s: %s", contract.name, note)
        description = f"{description} ({note})" if description else note
    return dataclasses.replace(contract, model=model, description=description, composition=tuple(Entry(**e.__dict__) for e in entries))


def _check_geometry(entries: list[Entry], spec, registry) -> None:
    """Refuse, naming the config field, a model whose shapes a pinned impl cannot run (`Impl.check_geometry`)."""
    from ..model.spec import SpecError
    from ..validate import geometry_of

    geometry = geometry_of(spec)
    for entry in entries:
        impl = registry.get(entry.impl.id, entry.impl.version)
        if impl is not None and impl.check_geometry is not None:
            try:
                impl.check_geometry(entry.constants, geometry)
            except ValueError as error:
                raise SpecError(str(error)) from None
