"""Fitting a family contract to one model, and binding its ops for a case."""

import dataclasses

from ..contract.schema import Contract, Entry, Model
from ..runtime.registry import REGISTRY, Registry
from ..validate.battery import BOUNDARY_CONSTANTS
from .spec import RESIDUAL_NORM_OPS, ModelSpec, SpecError


GEMM_IMPLS = ("linear.triton", "linear.row_parallel.triton")


def _tile_table(impl_id: str, decode: bool = False) -> dict:
    """(N, K) -> GEMM tile constants for the impls whose tiles the contract keys on the weight shape;
    with `decode`, the tiles listed for engine_decode alone (same block_k, sized for small batches)."""
    from ..ops.linear import row_parallel_triton
    from ..ops.linear import triton as linear_triton

    if impl_id not in GEMM_IMPLS:
        return {}
    if decode:
        return linear_triton.HOPPER_DECODE_CONSTANTS
    return row_parallel_triton.HOPPER_CONSTANTS if impl_id == row_parallel_triton.ID else linear_triton.HOPPER_CONSTANTS


def _row_width_constants(entry: Entry, spec: ModelSpec) -> dict | None:
    """The listed constants of the row kernels (RMSNorm, log-probs) for this model's row width, keyed
    on the widest row the entry's ops reduce (the hidden size, or the head dim for an entry holding only
    q_norm/k_norm; the vocabulary) and never on the row count."""
    from ..ops.logprobs import triton as logprobs_triton
    from ..ops.rms_norm import triton as rms_norm_triton

    if entry.impl.id in ("rms_norm.triton", "rms_norm.residual.triton"):
        width = max(spec.head_dim if op in ("q_norm", "k_norm") else spec.hidden_size for op in entry.ops)
        return rms_norm_triton.HOPPER_CONSTANTS.get(width)
    if entry.impl.id == "logprobs.triton":
        return logprobs_triton.HOPPER_CONSTANTS.get(spec.vocab_size)
    return None


def _dominant_tile(entry: Entry, spec: ModelSpec, table: dict) -> dict | None:
    """The tile listed for the shapes doing most of the entry's work (weight elements over all layers;
    lm_head counts once), or None when no shape of the entry is listed."""
    work = {}
    for op in entry.ops:
        tiles = table.get(spec.linear_shapes.get(op))
        if tiles is not None:
            n, k = spec.linear_shapes[op]
            key = tuple(sorted(tiles.items()))
            work[key] = work.get(key, 0) + n * k * (1 if op == "lm_head" else spec.num_hidden_layers)
    return dict(max(work, key=work.get)) if work else None


def _fit_tiles(entry: Entry, spec: ModelSpec) -> list[Entry]:
    """The entry with the kernel constants listed for its ops' shapes; never chosen from M.

    A contract pins one entry per (region, case), so all of an entry's projections share one GEMM tile:
    the tile of the shapes doing most of the work. Where a decode tile is listed too, engine_decode gets
    an entry of its own with it (the battery must then show decode rows bitwise equal to the other
    cases' rows). Row kernels take the constants of their widest row. Without a listed choice the entry
    keeps its constants."""
    row = _row_width_constants(entry, spec)
    if row is not None:
        return [dataclasses.replace(entry, constants={**entry.constants, **row})]
    tile = _dominant_tile(entry, spec, _tile_table(entry.impl.id))
    fitted = dataclasses.replace(entry, constants={**entry.constants, **tile}) if tile else entry
    decode = _dominant_tile(entry, spec, _tile_table(entry.impl.id, decode=True))
    if decode is None or "engine_decode" not in entry.cases or len(entry.cases) == 1:
        return [fitted]
    others = [case for case in entry.cases if case != "engine_decode"]
    return [dataclasses.replace(fitted, cases=others),
            dataclasses.replace(fitted, cases=["engine_decode"], constants={**fitted.constants, **decode})]


def fit_contract(contract: Contract, spec: ModelSpec, profile: str | None = None) -> Contract:
    """The family contract as this model runs it: its architecture, only the ops it has, its parameter
    dtype at the op boundaries, and the kernel constants listed for its shapes (GEMM tiles by (N, K), row
    kernels by row width).
    Every change shows in the identities."""
    model_ops = _model_ops(contract, spec, contract.cases)
    boundary = next((e.constants[k] for e in contract.composition for k in BOUNDARY_CONSTANTS if k in e.constants), spec.dtype)
    entries = []
    for entry in contract.composition:
        ops = [op for op in entry.ops if op in model_ops]
        if not ops:
            continue
        constants = {k: (spec.dtype if k in BOUNDARY_CONSTANTS and v == boundary else v) for k, v in entry.constants.items()}
        entries += _fit_tiles(dataclasses.replace(entry, ops=ops, constants=constants), spec)
    _check_geometry(entries, spec)
    model = Model(family=contract.model.family, architecture=spec.architecture, profile=profile or contract.model.profile)
    return dataclasses.replace(contract, model=model, composition=tuple(Entry(**e.__dict__) for e in entries))


def _check_geometry(entries: list[Entry], spec: ModelSpec, registry: Registry = REGISTRY) -> None:
    """Refuse, naming the config field, a model whose shapes a pinned impl cannot run (`Impl.check_geometry`)."""
    from .. import ops  # noqa: F401  (registers the op families)
    from ..validate import geometry_of

    geometry = geometry_of(spec)
    for entry in entries:
        impl = registry.get(entry.impl.id, entry.impl.version)
        if impl is not None and impl.check_geometry is not None:
            try:
                impl.check_geometry(entry.constants, geometry)
            except ValueError as error:
                raise SpecError(str(error)) from None


def _composed_norms(contract: Contract, cases) -> set[str]:
    """The norms after a residual add that `contract` pins in plain `rms_norm` in any of `cases`: `bind`
    composes each with the contract's `residual_add` op."""
    return {op for entry in contract.composition if entry.region == "rms_norm" and not set(entry.cases).isdisjoint(cases)
            for op in entry.ops if op in RESIDUAL_NORM_OPS}


def _model_ops(contract: Contract, spec: ModelSpec, cases) -> frozenset[str]:
    """The ops the model needs `contract` to pin in `cases`: its own, and `residual_add` where a norm is composed."""
    return spec.ops | ({"residual_add"} if _composed_norms(contract, cases) else set())


def _add_then_norm(add, norm):
    """A plain norm in the model's fused shape: `add` then `norm`, called one after the other as if unfused."""

    def rms_norm_residual(x, residual, weight, eps, zero_centered=False):
        s = x if residual is None else add(x, residual)
        return norm(s, weight, eps, zero_centered), s

    return rms_norm_residual


def bind(contract: Contract, spec: ModelSpec, case: str, registry: Registry = REGISTRY) -> dict:
    """The bound ops of `case`; refuses a contract that leaves one of the model's ops unpinned.

    The norms after a residual add are called as (x, residual) -> (y, x + residual): an op pinned in
    `rms_norm.residual` is that already; one pinned in plain `rms_norm` is composed with `residual_add`."""
    from .. import ops  # noqa: F401  (registers the op families)

    bound = registry.bind_ops(contract, case)
    needed = _model_ops(contract, spec, [case]) - ({"sample"} if contract.cases[case].role == "trainer" else set())
    missing = sorted(needed - set(bound))
    if missing:
        raise ValueError(f"contract {contract.name} does not pin op(s) {', '.join(missing)} for case {case}")
    for op in _composed_norms(contract, [case]):
        bound[op] = _add_then_norm(bound["residual_add"], bound[op])
    return bound
