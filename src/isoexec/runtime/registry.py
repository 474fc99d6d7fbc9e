"""The impl registry: which callable computes a region in a case, and the source that decides its bits.

Op families register their impls here under `id@version`; `Registry.resolve` turns a contract into one
impl per (region, case) and refuses anything the contract pins that this process cannot honour. The
process-wide `REGISTRY` registers the built-in op families (`ops.register`) the first time it is read.
"""

import functools
import hashlib
import inspect
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable


def _source_file(obj) -> Path | None:
    target = getattr(obj, "fn", obj)  # a Triton JITFunction keeps the Python function in `.fn`
    try:
        return Path(inspect.getsourcefile(inspect.unwrap(target)))
    except (TypeError, OSError):
        return None


@dataclass(frozen=True, eq=False)
class Impl:
    """One registered implementation of a region.

    `fn` takes the contract's constants as keyword-only parameters: the ones without a default are
    required, no others are accepted. `cases` are the cases the impl claims to serve;
    `check_constants(constants)` may further refuse values it does not implement (ValueError);
    `sources` are further objects (functions, kernels, modules) whose source text decides its bits,
    beyond the file that defines `fn`; `gpu_kernels`, whether `fn` launches compiled GPU (Triton)
    kernels, which on a CPU run only in Triton's interpreter; `check_geometry(constants, geometry)`
    may refuse the shapes of a model (`validate.geometry_of`) the impl cannot run (ValueError naming
    the config field), so that a contract is refused when it is fitted, not in the forward;
    `tune(ops, cases, spec, arch)` gives the constants its family's tables list for a model on a device
    arch, as [(cases, constants to set)], or None where the arch has no table (`contract/fit.py`);
    `row_width(num_v_heads, k_dim, v_dim, constants)`, for an impl of a recurrent region (`gdn.core`), the floats per
    value head of each open-chunk row it keeps in the engine's cache under the entry's constants (`model/state.py`
    allocates them);
    `leaf_parts = (partials, fold)`, for a row-parallel linear, its two halves a tensor-parallel rank runs
    around the gather of every rank's leaf partials (`parallel/ops.py`); `vocab_parallel(logits, gather,
    **constants)`, for a log-probs impl, a rank's rows over its whole vocab blocks, the per-block leaves of
    every rank put together by `gather` (`parallel/ops.py`); `joined = (forward, can_join)`, for a linear
    impl that can run sibling projections of one input as one call over their joined weights, each part
    bitwise its own call (`ops/linear/joined.py`): `forward(x, weight, bias, widths, **constants)` -> one
    output per part, and `can_join(widths, **constants)`.
    """

    id: str
    version: int
    region: str
    cases: frozenset
    fn: Callable
    check_constants: Callable[[dict], None] | None = None
    sources: tuple = field(default=())
    gpu_kernels: bool = False
    check_geometry: Callable[[dict, dict], None] | None = None
    tune: Callable | None = None
    row_width: Callable[[int, int, int, dict], int] | None = None
    leaf_parts: tuple[Callable, Callable] | None = None
    vocab_parallel: Callable | None = None
    joined: tuple[Callable, Callable] | None = None

    @property
    def ref(self) -> str:
        return f"{self.id}@{self.version}"

    def check(self, constants: dict) -> None:
        """Raise ValueError unless `constants` are exactly what `fn` takes, with supported values."""
        params = inspect.signature(self.fn).parameters.values()
        accepted = {p.name: p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        unknown = [] if takes_any else sorted(set(constants) - set(accepted))
        missing = sorted(n for n, p in accepted.items() if p.default is inspect.Parameter.empty and n not in constants)
        if unknown:
            raise ValueError(f"unsupported constants {', '.join(unknown)} (accepted: {', '.join(sorted(accepted))})")
        if missing:
            raise ValueError(f"missing constants {', '.join(missing)}")
        if self.check_constants is not None:
            self.check_constants(constants)

    def bind(self, constants: dict):
        """`fn` with the contract's constants applied: call it with the op's tensors."""
        self.check(constants)
        return functools.partial(self.fn, **constants)

    @cached_property
    def source_sha256(self) -> str | None:
        """SHA-256 over the source files of `fn` and `sources`, or None when any cannot be read."""
        files = []
        for obj in (self.fn, *self.sources):
            path = _source_file(obj)
            if path is None or not path.is_file():
                return None
            files.append(path)
        digest = hashlib.sha256()
        for path in sorted(set(files)):
            digest.update(path.read_bytes())
        return "sha256:" + digest.hexdigest()


class ResolutionError(ValueError):
    """The contract pins something this process cannot run; the message lists every problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class Registry:
    """Impls by `id@version`, and the admission-battery probe of each region."""

    def __init__(self, populate: Callable[["Registry"], None] | None = None):
        self._impls: dict[tuple[str, int], Impl] = {}
        self._probes: dict[str, Callable] = {}
        self._populate = populate

    def _populated(self) -> "Registry":
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)
        return self

    def load(self) -> "Registry":
        """Register the built-in op families now rather than on first use."""
        return self._populated()

    def register_probe(self, region: str, probe: Callable) -> None:
        self._populated()
        if region in self._probes:
            raise ValueError(f"a probe for region {region!r} is already registered")
        self._probes[region] = probe

    def probe(self, region: str) -> Callable | None:
        return self._populated()._probes.get(region)

    def register(self, impl: Impl) -> Impl:
        self._populated()
        key = (impl.id, impl.version)
        if key in self._impls:
            raise ValueError(f"impl {impl.ref} is already registered")
        self._impls[key] = impl
        return impl

    def get(self, impl_id: str, version: int) -> Impl | None:
        return self._populated()._impls.get((impl_id, version))

    def __iter__(self):
        return iter(sorted(self._populated()._impls.values(), key=lambda impl: (impl.region, impl.id, impl.version)))

    def __len__(self) -> int:
        return len(self._populated()._impls)

    def resolve(self, contract, cases=None) -> dict[tuple[str, str], Impl]:
        """One impl per (region, case) of `contract`, for `cases` (default: all of them)."""
        wanted = set(contract.cases if cases is None else cases)
        installed, problems = {}, []
        for region, case, entry in contract.cells():
            if case not in wanted:
                continue
            where = f"{region}/{case}"
            impl = self.get(entry.impl.id, entry.impl.version)
            if impl is None:
                known = ", ".join(i.ref for i in self if i.region == region) or "none"
                problems.append(f'{where}: impl "{entry.impl}" is not registered (registered for {region}: {known})')
                continue
            if impl.region != region:
                problems.append(f'{where}: impl "{impl.ref}" implements region "{impl.region}", not "{region}"')
                continue
            if case not in impl.cases:
                problems.append(f'{where}: impl "{impl.ref}" does not claim case "{case}" (claims: {", ".join(sorted(impl.cases))})')
                continue
            try:
                impl.check(entry.constants)
            except ValueError as error:
                problems.append(f'{where}: impl "{impl.ref}" rejects its constants: {error}')
                continue
            installed[region, case] = impl
        if problems:
            raise ResolutionError(problems)
        return installed


def _builtin_ops(registry: Registry) -> None:
    from .. import ops

    ops.register(registry)


REGISTRY = Registry(_builtin_ops)
