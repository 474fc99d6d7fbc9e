"""Field-level differences between two projections, named by region, case and field."""

import json
from dataclasses import dataclass

ABSENT = object()


def _walk(a, b, path: tuple):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from _walk(a.get(key, ABSENT), b.get(key, ABSENT), path + (key,))
    elif a != b:
        yield path, a, b


def _show(value) -> str:
    if value is ABSENT:
        return "(absent)"
    if isinstance(value, dict):
        return "(present)"
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Difference:
    """One field that differs. `region`/`case` are set when the field belongs to one."""

    scope: str
    field: str
    a: object
    b: object
    region: str | None = None
    case: str | None = None
    a_name: str = "A"
    b_name: str = "B"

    def where(self, case: str | None = None) -> str:
        case = case or self.case
        if self.region and case:
            return f"{self.region}/{case}"
        if self.region:
            return self.region
        if case:
            return f"case {case}"
        return ""

    def render(self, case: str | None = None) -> str:
        place = " ".join(p for p in (self.where(case), self.field) if p)
        return f"{self.scope}: {place}: {self.a_name}={_show(self.a)} {self.b_name}={_show(self.b)}"

    def to_dict(self) -> dict:
        values = {name: None if value is ABSENT else value for name, value in ((self.a_name, self.a), (self.b_name, self.b))}
        where = {"region": self.region, "case": self.case}
        return {"scope": self.scope, **where, "field": self.field, "values": values, "text": self.render()}


def diff_projection(scope: str, a: dict, b: dict, a_name: str = "A", b_name: str = "B") -> list[Difference]:
    """Differences between two projections of the same kind (see `identity.PROJECTIONS`)."""
    out = []
    for path, va, vb in _walk(a, b, ()):
        head, rest = (path[0], path[1:]) if path else ("", ())
        region = case = None
        if head == "regions" and rest:
            region, rest = rest[0], rest[1:]
            if rest:
                case, rest = rest[0], rest[1:]
            field = ".".join(map(str, rest)) or ("region" if case is None else "cell")
        elif head in ("cases", "ops") and rest:
            case, rest = rest[0], rest[1:]
            field = ".".join(map(str, (head,) + rest)) if head == "ops" else (".".join(map(str, rest)) or "case")
        else:
            field = ".".join(map(str, path))
        out.append(Difference(scope, field, va, vb, region=region, case=case, a_name=a_name, b_name=b_name))
    return out


def render_grouped(differences: list[Difference]) -> list[str]:
    """One line per difference, merging cells that differ identically in several cases of a region."""
    groups: dict[tuple, list[str]] = {}
    for d in differences:
        key = (d.scope, d.region, d.field, _show(d.a), _show(d.b), d.a_name, d.b_name, d.case is None)
        groups.setdefault(key, []).append(d)
    lines = []
    for members in groups.values():
        cases = [d.case for d in members if d.case]
        lines.append(members[0].render("{" + ",".join(cases) + "}" if len(cases) > 1 else None))
    return lines
