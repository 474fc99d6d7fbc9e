"""Canonical JSON and the three SHA-256 identities of a contract.

Each identity hashes a *projection* of the contract: a plain JSON tree holding only the fields that
identity is about, keyed by name rather than by position. Composition entries are expanded into one
cell per (region, case), so the identities do not depend on entry order, key order, or on how cases
are grouped into entries — only on what each cell pins.
"""

import hashlib
import json
from dataclasses import dataclass

from .schema import Contract, to_plain


def _check_no_floats(obj, path: str = "") -> None:
    if isinstance(obj, float):
        raise TypeError(f"{path or 'value'}: floats are not allowed in canonical JSON")
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: keys must be strings, got {key!r}")
            _check_no_floats(value, f"{path}.{key}" if path else key)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _check_no_floats(value, f"{path}[{i}]")


def canonical_json(obj) -> bytes:
    """Sorted keys, no whitespace, UTF-8, no floats: one byte string per value."""
    _check_no_floats(obj)
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def sha256_id(obj) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(obj)).hexdigest()


def semantic_projection(contract: Contract) -> dict:
    """Which function is computed: the model, the cases and the logical ops each case runs."""
    ops = {case: set() for case in contract.cases}
    for _, case, entry in contract.cells():
        ops[case].update(entry.ops)
    return {
        "schema_version": contract.schema_version,
        "model": to_plain(contract.model),
        "cases": {name: {"role": c.role, "grad": c.grad} for name, c in contract.cases.items()},
        "ops": {case: sorted(names) for case, names in ops.items()},
    }


def numerical_policy_projection(contract: Contract) -> dict:
    """Everything that decides bits, one cell per (region, case), plus the claims."""
    regions: dict[str, dict] = {}
    for region, case, entry in contract.cells():
        regions.setdefault(region, {})[case] = {
            "ops": list(entry.ops),
            "impl": str(entry.impl),
            "constants": to_plain(entry.constants),
            "discharge": to_plain(entry.discharge),
        }
    return {
        "schema_version": contract.schema_version,
        "cases": to_plain(contract.cases),
        "regions": regions,
        "claims": to_plain(contract.claims),
    }


def deployment_projection(contract: Contract) -> dict:
    """How the contract is deployed: sizes and switches that may change without changing bits."""
    return {"schema_version": contract.schema_version, "deployment": to_plain(contract.deployment)}


PROJECTIONS = {
    "semantic": semantic_projection,
    "numerical_policy": numerical_policy_projection,
    "deployment": deployment_projection,
}


@dataclass(frozen=True)
class Identities:
    semantic: str
    numerical_policy: str
    deployment: str

    def to_dict(self) -> dict:
        return {"semantic": self.semantic, "numerical_policy": self.numerical_policy, "deployment": self.deployment}


def identities(contract: Contract) -> Identities:
    return Identities(**{name: sha256_id(project(contract)) for name, project in PROJECTIONS.items()})
