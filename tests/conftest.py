import copy
import tomllib
from importlib import resources

import pytest

from isoexec.contract import Contract


def preset_dict(name: str) -> dict:
    """A fresh, mutable parse of a shipped preset file."""
    text = (resources.files("isoexec.contract") / "presets" / f"{name}.toml").read_text("utf-8")
    return tomllib.loads(text)


@pytest.fixture
def dense() -> dict:
    return preset_dict("tiny-dense")


@pytest.fixture
def native() -> dict:
    return preset_dict("native")


def mutated(data: dict, edit) -> Contract:
    """Apply `edit` to a deep copy of `data` and build the contract."""
    data = copy.deepcopy(data)
    edit(data)
    return Contract.from_dict(data)


def entry_index(data: dict, region: str) -> int:
    return next(i for i, e in enumerate(data["composition"]) if e["region"] == region)
