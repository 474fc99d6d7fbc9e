"""Reading and writing contracts: TOML for people, canonical JSON for machines and hashing.

Everything that reads a contract accepts either format, a file path, or the name of a shipped preset.
"""

import json
import tomllib
from importlib import resources
from pathlib import Path

from .identity import canonical_json
from .schema import Contract
from .values import ContractError

_PRESETS = resources.files(__package__) / "presets"


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in _PRESETS.iterdir() if p.name.endswith(".toml"))


def _reject_duplicate_keys(pairs):
    table = {}
    for key, value in pairs:
        if key in table:
            raise ContractError(str(key), "duplicate key")
        table[key] = value
    return table


def _reject_constant(name):
    raise ContractError("", f"{name} is not allowed: floats are never stored raw")


def parse(text: str, fmt: str, source: str = "") -> Contract:
    """Parse contract text in `fmt` ("toml" or "json") and validate it."""
    try:
        if fmt == "json":
            try:
                data = json.loads(text, object_pairs_hook=_reject_duplicate_keys, parse_constant=_reject_constant)
            except json.JSONDecodeError as error:
                raise ContractError("", f"invalid JSON: {error}") from None
        elif fmt == "toml":
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as error:
                raise ContractError("", f"invalid TOML: {error}") from None
        else:
            raise ValueError(f"unknown contract format {fmt!r}")
        return Contract.from_dict(data)
    except ContractError as error:
        raise error.from_source(source) from None


def _format_of(path: Path, text: str) -> str:
    if path.suffix.lower() in (".json", ".toml"):
        return path.suffix.lower()[1:]
    return "json" if text.lstrip().startswith("{") else "toml"


def load_file(path: str | Path) -> Contract:
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ContractError("", "no such file", str(path)) from None
    except IsADirectoryError:
        raise ContractError("", "is a directory, not a contract file", str(path)) from None
    except UnicodeDecodeError:
        raise ContractError("", "not UTF-8 text", str(path)) from None
    except OSError as error:
        raise ContractError("", f"cannot read: {error.strerror}", str(path)) from None
    return parse(text, _format_of(path, text), str(path))


def load_preset(name: str) -> Contract:
    if name not in preset_names():
        raise ContractError("", f'unknown preset "{name}" (available: {", ".join(preset_names())})')
    return parse((_PRESETS / f"{name}.toml").read_text("utf-8"), "toml", f"preset {name}")


def load(spec: str | Path) -> Contract:
    """A contract from a file path, or from a preset name when no such file exists."""
    path = Path(spec)
    if path.exists() or isinstance(spec, Path) or path.suffix.lower() in (".toml", ".json") or "/" in str(spec):
        return load_file(path)
    if str(spec) in preset_names():
        return load_preset(str(spec))
    raise ContractError(
        "", f'"{spec}" is neither a contract file nor a preset (presets: {", ".join(preset_names())})'
    )


def dump_json(contract: Contract) -> str:
    """The whole contract as canonical JSON text; `parse(dump_json(c), "json") == c`."""
    return canonical_json(contract.to_dict()).decode("utf-8")
