"""The execution contract as typed dataclasses, validated on construction.

Constructing any of these classes, directly or through `Contract.from_dict`, either yields a valid,
normalised object or raises `ContractError` naming the offending field by its path in the file
(`composition[3].constants.block_k: expected a positive int, got "64"`). Normalisation sorts every
set-like list, so two spellings of the same contract compare (and hash) equal.
"""

from dataclasses import MISSING, dataclass, field, fields, is_dataclass

from . import vocabulary as V
from .values import (
    DOTTED_NAME,
    IDENTIFIER,
    ContractError,
    canonical_real,
    canonical_tolerance,
    check_bool,
    check_choice,
    check_int,
    check_list,
    check_str,
    fail,
    is_int,
    join,
    show,
)


def _set(obj, name: str, value) -> None:
    object.__setattr__(obj, name, value)


def _coerce(obj, name: str, cls) -> None:
    """Build nested table `name` of `obj` in place, so direct construction from dicts works too."""
    value = getattr(obj, name)
    if not isinstance(value, cls):
        _set(obj, name, build(cls, value, name))


def build(cls, data, path: str = ""):
    """Construct dataclass `cls` from a parsed table, rejecting unknown and missing keys."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise fail(path, "a table", data)
    known = {f.name: f for f in fields(cls)}
    for key in data:
        if key not in known:
            expected = ", ".join(sorted(known))
            raise ContractError(join(path, str(key)), f"unknown key (expected one of: {expected})")
    for name, f in known.items():
        if name not in data and f.default is MISSING and f.default_factory is MISSING:
            raise ContractError(join(path, name), "missing required key")
    try:
        return cls(**data)
    except ContractError as error:
        raise error.within(path) from None


def to_plain(obj):
    """The canonical document form: dataclasses become tables, tuples lists, unset optionals vanish."""
    if is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in fields(obj) if getattr(obj, f.name) is not None}
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


@dataclass(frozen=True, kw_only=True)
class Model:
    family: str
    architecture: str
    profile: str

    def __post_init__(self):
        for name in ("family", "architecture", "profile"):
            check_str(name, getattr(self, name))


@dataclass(frozen=True, kw_only=True)
class ShapeDomain:
    """The shapes over which the contract's claims hold for one case."""

    max_seq_len: int
    max_num_seqs: int
    max_num_tokens: int
    max_query_len: int

    def __post_init__(self):
        for f in fields(self):
            check_int(f.name, getattr(self, f.name))
        if self.max_query_len > self.max_seq_len:
            raise ContractError("max_query_len", f"{self.max_query_len} exceeds max_seq_len {self.max_seq_len}")
        if self.max_query_len > self.max_num_tokens:
            raise ContractError("max_query_len", f"{self.max_query_len} exceeds max_num_tokens {self.max_num_tokens}")


@dataclass(frozen=True, kw_only=True)
class Case:
    role: str
    grad: str
    state: tuple[str, ...]
    shape_domain: ShapeDomain

    def __post_init__(self):
        check_choice("role", self.role, V.ROLES)
        check_choice("grad", self.grad, V.GRAD_MODES)
        if self.role == "engine" and self.grad != "no_grad":
            raise ContractError("grad", 'an engine case runs without autograd: expected "no_grad"')
        state = check_list("state", self.state, lambda p, v: check_choice(p, v, V.STATE_KINDS), non_empty=False)
        _set(self, "state", tuple(sorted(state)))
        _coerce(self, "shape_domain", ShapeDomain)

    @property
    def state_mode(self) -> str:
        return "+".join(self.state) or "stateless"


@dataclass(frozen=True, kw_only=True)
class ImplRef:
    id: str
    version: int

    def __post_init__(self):
        check_str("id", self.id, pattern=DOTTED_NAME, what='a dotted lower-case name ("linear.reference")')
        check_int("version", self.version)

    def __str__(self) -> str:
        return f"{self.id}@{self.version}"


@dataclass(frozen=True, kw_only=True)
class Discharge:
    """How equality across an entry's cases is established.

    `bitwise_equal_to`: every case of the entry is bitwise equal to the region in `case` (the
    admission battery validates it); `proof`: a named argument that the op is exact; `none`: no claim.
    """

    method: str
    case: str | None = None
    proof: str | None = None

    def __post_init__(self):
        check_choice("method", self.method, V.DISCHARGE_METHODS)
        wants = {"bitwise_equal_to": "case", "proof": "proof", "none": None}[self.method]
        for name in ("case", "proof"):
            value = getattr(self, name)
            if name == wants:
                if value is None:
                    raise ContractError(name, f'required when method is "{self.method}"')
                if name == "case":
                    check_str(name, value, pattern=IDENTIFIER, what="a case name")
                else:
                    check_choice(name, value, tuple(V.PROOFS))
            elif value is not None:
                raise ContractError(name, f'not allowed when method is "{self.method}"')


def _check_schema_version(value) -> None:
    if not is_int(value) or value != V.SCHEMA_VERSION:
        raise ContractError("schema_version", f"unsupported version {show(value)} (this isoexec reads {V.SCHEMA_VERSION})")


def _check_constant(path: str, name: str, value):
    if name in V.DTYPE_CONSTANTS:
        return check_choice(path, value, V.DTYPES)
    if name in V.POSITIVE_INT_CONSTANTS:
        return check_int(path, value)
    if name in V.NON_NEGATIVE_INT_CONSTANTS:
        return check_int(path, value, minimum=0)
    if name in V.POWER_OF_TWO_CONSTANTS:
        return check_int(path, value, power_of_two=True)
    if name in V.TREE_CONSTANTS:
        return check_choice(path, value, V.TREE_SHAPES)
    if name in V.REAL_CONSTANTS:
        return canonical_real(path, value)
    if isinstance(value, (list, tuple)):
        return check_list(path, value, _check_scalar, non_empty=False, unique=False)
    return _check_scalar(path, value)


def _check_scalar(path: str, value):
    if isinstance(value, (bool, str)) or is_int(value):
        return value
    raise fail(path, "an int, bool or string", value)


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One composition entry: the impl and constants a region uses in the listed cases."""

    region: str
    ops: tuple[str, ...]
    cases: tuple[str, ...]
    impl: ImplRef
    constants: dict = field(default_factory=dict)
    discharge: Discharge

    def __post_init__(self):
        check_choice("region", self.region, tuple(V.REGIONS))
        name = lambda p, v: check_str(p, v, pattern=IDENTIFIER, what="a lower-case identifier")  # noqa: E731
        _set(self, "ops", tuple(sorted(check_list("ops", self.ops, name))))
        _set(self, "cases", tuple(sorted(check_list("cases", self.cases, name))))
        _coerce(self, "impl", ImplRef)
        _coerce(self, "discharge", Discharge)
        if not isinstance(self.constants, dict):
            raise fail("constants", "a table", self.constants)
        constants = {}
        for key in sorted(self.constants):
            check_str(f"constants.{key}", key, pattern=IDENTIFIER, what="a lower-case identifier as a key")
            constants[key] = _check_constant(f"constants.{key}", key, self.constants[key])
        _set(self, "constants", constants)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Parallel sizes under which the claims hold, for either side."""

    tp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    sp: tuple[bool, ...] = (False,)

    def __post_init__(self):
        _set(self, "tp", tuple(sorted(check_list("tp", self.tp, check_int))))
        _set(self, "ep", tuple(sorted(check_list("ep", self.ep, check_int))))
        _set(self, "sp", tuple(sorted(check_list("sp", self.sp, check_bool))))


@dataclass(frozen=True, kw_only=True)
class StateClaims:
    """Engine state handling under which the claims hold."""

    prefix_caching: bool = False
    chunked_prefill: bool = False
    preemption: bool = False
    cuda_graphs: bool = False

    def __post_init__(self):
        for f in fields(self):
            check_bool(f.name, getattr(self, f.name))


@dataclass(frozen=True, kw_only=True)
class Claims:
    topology: Topology = field(default_factory=Topology)
    state: StateClaims = field(default_factory=StateClaims)
    tolerances: dict = field(default_factory=dict)

    def __post_init__(self):
        _coerce(self, "topology", Topology)
        _coerce(self, "state", StateClaims)
        if not isinstance(self.tolerances, dict):
            raise fail("tolerances", "a table", self.tolerances)
        tolerances = {}
        for key in sorted(self.tolerances):
            check_choice(f"tolerances.{key}", key, V.TOLERANCE_QUANTITIES)
            tolerances[key] = canonical_tolerance(f"tolerances.{key}", self.tolerances[key])
        _set(self, "tolerances", tolerances)

    @property
    def is_bitwise(self) -> bool:
        return any(value == "0" for value in self.tolerances.values())


@dataclass(frozen=True, kw_only=True)
class EngineDeployment:
    name: str = "isoexec"
    kv_page_size: int = 16
    prefill_chunk_size: int = 256
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    prefix_caching: bool = True
    cuda_graphs: bool = False
    tp: int = 1
    ep: int = 1
    dp: int = 1

    def __post_init__(self):
        check_str("name", self.name)
        for name in ("kv_page_size", "prefill_chunk_size", "max_num_seqs", "max_num_batched_tokens", "tp", "ep", "dp"):
            check_int(name, getattr(self, name))
        check_bool("prefix_caching", self.prefix_caching)
        check_bool("cuda_graphs", self.cuda_graphs)


@dataclass(frozen=True, kw_only=True)
class TrainerDeployment:
    name: str = "isoexec"
    micro_batch_tokens: int = 4096
    tp: int = 1
    ep: int = 1
    sp: bool = False
    dp: int = 1

    def __post_init__(self):
        check_str("name", self.name)
        for name in ("micro_batch_tokens", "tp", "ep", "dp"):
            check_int(name, getattr(self, name))
        check_bool("sp", self.sp)


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """How the contract is deployed: everything here may change without changing a single bit."""

    engine: EngineDeployment = field(default_factory=EngineDeployment)
    trainer: TrainerDeployment = field(default_factory=TrainerDeployment)

    def __post_init__(self):
        _coerce(self, "engine", EngineDeployment)
        _coerce(self, "trainer", TrainerDeployment)


@dataclass(frozen=True, kw_only=True)
class Contract:
    schema_version: int
    name: str
    description: str = ""
    model: Model
    cases: dict
    composition: tuple[Entry, ...]
    claims: Claims
    deployment: Deployment = field(default_factory=Deployment)

    @classmethod
    def from_dict(cls, data) -> "Contract":
        if isinstance(data, dict) and "schema_version" in data:
            _check_schema_version(data["schema_version"])
        return build(cls, data)

    def to_dict(self) -> dict:
        return to_plain(self)

    def entry(self, region: str, case: str) -> Entry | None:
        """The composition entry that pins `region` in `case`, if any."""
        for entry in self.composition:
            if entry.region == region and case in entry.cases:
                return entry
        return None

    def cells(self):
        """Every (region, case, entry) the contract pins, in canonical order."""
        for entry in self.composition:
            for case in entry.cases:
                yield entry.region, case, entry

    def cases_of(self, role: str) -> tuple[str, ...]:
        return tuple(sorted(name for name, case in self.cases.items() if case.role == role))

    def __post_init__(self):
        _check_schema_version(self.schema_version)
        check_str("name", self.name)
        for name, cls in (("model", Model), ("claims", Claims), ("deployment", Deployment)):
            _coerce(self, name, cls)
        if not isinstance(self.description, str):
            raise fail("description", "a string", self.description)
        self._check_cases()
        self._check_composition()
        self._check_deployment()
        ordered = sorted(self.composition, key=lambda e: (e.region, e.cases))
        _set(self, "composition", tuple(ordered))
        _set(self, "cases", dict(sorted(self.cases.items())))

    def _check_cases(self):
        if not isinstance(self.cases, dict):
            raise fail("cases", "a table", self.cases)
        for name in self.cases:
            check_str(f"cases.{name}", name, pattern=IDENTIFIER, what="a lower-case identifier as a case name")
        _set(self, "cases", {name: build(Case, case, f"cases.{name}") for name, case in self.cases.items()})
        for name in V.REQUIRED_CASES:
            if name not in self.cases:
                raise ContractError("cases", f'missing required case "{name}"')

    def _check_composition(self):
        if not isinstance(self.composition, (list, tuple)) or not self.composition:
            raise fail("composition", "a non-empty array of tables", self.composition)
        _set(self, "composition", tuple(build(Entry, e, f"composition[{i}]") for i, e in enumerate(self.composition)))
        covered = {}  # (region, case) -> entry index
        op_owner = {}  # (op, case) -> entry index
        for i, entry in enumerate(self.composition):
            at = f"composition[{i}]"
            applies_to = V.REGIONS[entry.region]
            for case in entry.cases:
                if case not in self.cases:
                    raise ContractError(f"{at}.cases", f'unknown case "{case}" (defined: {", ".join(sorted(self.cases))})')
                if self.cases[case].role not in applies_to:
                    raise ContractError(
                        f"{at}.cases", f'region "{entry.region}" does not run in {self.cases[case].role} case "{case}"'
                    )
                if (entry.region, case) in covered:
                    other = covered[entry.region, case]
                    raise ContractError(
                        f"{at}.cases", f'region "{entry.region}" in case "{case}" is already pinned by composition[{other}]'
                    )
                covered[entry.region, case] = i
                for op in entry.ops:
                    if (op, case) in op_owner:
                        other = op_owner[op, case]
                        raise ContractError(
                            f"{at}.ops", f'op "{op}" in case "{case}" is already assigned by composition[{other}]'
                        )
                    op_owner[op, case] = i
        for region in sorted({entry.region for entry in self.composition}):
            for case, spec in sorted(self.cases.items()):
                if spec.role in V.REGIONS[region] and (region, case) not in covered:
                    raise ContractError("composition", f'region "{region}" is not pinned for case "{case}"')
        for i, entry in enumerate(self.composition):
            at = f"composition[{i}].discharge"
            if entry.discharge.method == "bitwise_equal_to" and (entry.region, entry.discharge.case) not in covered:
                raise ContractError(
                    f"{at}.case", f'region "{entry.region}" is not pinned for case "{entry.discharge.case}"'
                )
            if entry.discharge.method == "none" and self.claims.is_bitwise:
                raise ContractError(
                    f"{at}.method", '"none" is not allowed in a contract that claims a tolerance of "0" (bitwise)'
                )

    def _check_deployment(self):
        engine = self.deployment.engine
        if not self.claims.is_bitwise:
            return
        topology, state = self.claims.topology, self.claims.state
        for side, names in (("engine", ("tp", "ep")), ("trainer", ("tp", "ep", "sp"))):
            for name in names:
                value = getattr(getattr(self.deployment, side), name)
                if value not in getattr(topology, name):
                    raise ContractError(
                        f"deployment.{side}.{name}", f"{show(value)} is outside claims.topology.{name} {show(getattr(topology, name))}"
                    )
        for name in ("prefix_caching", "cuda_graphs"):
            if getattr(engine, name) and not getattr(state, name):
                raise ContractError(f"deployment.engine.{name}", f"enabled, but claims.state.{name} is false")
        prefill = [c for c, spec in self.cases.items() if spec.role == "engine" and "kv_cache" in spec.state]
        longest = max((self.cases[c].shape_domain.max_seq_len for c in prefill), default=0)
        if engine.prefill_chunk_size < longest and not state.chunked_prefill:
            raise ContractError(
                "deployment.engine.prefill_chunk_size",
                f"{engine.prefill_chunk_size} splits prompts of up to {longest} tokens, but claims.state.chunked_prefill is false",
            )

