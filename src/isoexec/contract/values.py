"""Path-carrying validation errors and the value checks every contract field is built from."""

import json
import re
from decimal import Decimal, InvalidOperation

IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")
DOTTED_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_DECIMAL = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
# A float written as its bit pattern, tagged with the format so 16-bit patterns are unambiguous.
_HEX_FLOAT = re.compile(r"^(f64|f32|bf16|f16):0[xX]([0-9a-fA-F]+)$")
_HEX_DIGITS = {"f64": 16, "f32": 8, "bf16": 4, "f16": 4}


class ContractError(ValueError):
    """A contract that cannot be read or is invalid; `path` names the offending field."""

    def __init__(self, path: str, problem: str, source: str = ""):
        super().__init__(path, problem)
        self.path = path
        self.problem = problem
        self.source = source

    def within(self, prefix: str) -> "ContractError":
        return ContractError(join(prefix, self.path), self.problem, self.source)

    def from_source(self, source: str) -> "ContractError":
        return ContractError(self.path, self.problem, source)

    def __str__(self) -> str:
        text = f"{self.path}: {self.problem}" if self.path else self.problem
        return f"{self.source}: {text}" if self.source else text


def join(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def show(value) -> str:
    """Render a value as it would appear in a file, so error messages quote what the user wrote."""
    if isinstance(value, float):
        return f"{value!r} (a raw float)"
    if isinstance(value, (str, bool, int)) or value is None:
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def fail(path: str, expected: str, value) -> ContractError:
    hint = ""
    if isinstance(value, float):
        hint = f'; floats are never stored raw: write "{value!r}" as a decimal string or its bit pattern, e.g. "f32:0x3f800000"'
    return ContractError(path, f"expected {expected}, got {show(value)}{hint}")


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_str(path: str, value, *, pattern: re.Pattern | None = None, what: str = "a non-empty string") -> str:
    if not isinstance(value, str) or not value or (pattern is not None and not pattern.match(value)):
        raise fail(path, what, value)
    return value


def check_choice(path: str, value, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise fail(path, "one of " + ", ".join(f'"{c}"' for c in choices), value)
    return value


def check_bool(path: str, value) -> bool:
    if not isinstance(value, bool):
        raise fail(path, "true or false", value)
    return value


def check_int(path: str, value, *, minimum: int = 1, power_of_two: bool = False) -> int:
    ok = is_int(value) and value >= minimum and (not power_of_two or value & (value - 1) == 0)
    if not ok:
        what = "a power of two" if power_of_two else ("a positive int" if minimum == 1 else f"an int ≥ {minimum}")
        raise fail(path, what, value)
    return value


def check_list(path: str, value, check_item, *, non_empty: bool = True, unique: bool = True) -> tuple:
    if not isinstance(value, (list, tuple)) or (non_empty and not value):
        raise fail(path, "a non-empty list" if non_empty else "a list", value)
    items = tuple(check_item(f"{path}[{i}]", v) for i, v in enumerate(value))
    if unique:
        seen = set()
        for i, item in enumerate(items):
            if item in seen:
                raise ContractError(f"{path}[{i}]", f"duplicate entry {show(item)}")
            seen.add(item)
    return items


def canonical_real(path: str, value) -> str:
    """A real number in the only two spellings a contract allows, normalised so equal values hash equal.

    Decimal strings are normalised (`"1e-6"` and `"0.000001"` become `"0.000001"`); bit patterns are
    tagged with their format (`"f32:0x3f800000"`) and lower-cased.
    """
    if isinstance(value, str):
        text = value.strip()
        if _DECIMAL.match(text):
            try:
                number = Decimal(text).normalize()
            except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
                raise fail(path, "a decimal string", value) from None
            return format(number, "f") if -20 < number.adjusted() < 20 else str(number)
        match = _HEX_FLOAT.match(text)
        if match and len(match.group(2)) == _HEX_DIGITS[match.group(1)]:
            return f"{match.group(1)}:0x{match.group(2).lower()}"
    raise fail(path, 'a decimal string ("0.001") or a tagged bit pattern ("f32:0x3a83126f")', value)


def canonical_tolerance(path: str, value) -> str:
    """A non-negative decimal string; "0" means bitwise equal."""
    text = canonical_real(path, value) if isinstance(value, str) and ":" not in value else None
    if text is None or Decimal(text) < 0:
        raise fail(path, 'a non-negative decimal string ("0" = bitwise)', value)
    return "0" if Decimal(text) == 0 else text
