"""The model families, each one small file: its spec from config.json, its checkpoint keys, its layers.

A family is registered by `register_family` (the built-in ones below); `from_hf_config` picks the
family by the config's `architectures` entry. Adding a family touches this folder, the layers it
needs (`model/layers/`) and their ops (`ops/`): the engine, trainer, audit and RL loop only see a
`ModelSpec` and the decoder.
"""

import json
from pathlib import Path

from ..spec import ModelSpec, SpecError
from . import deepseek_v3, dense, glm4_moe_lite, qwen3_5, qwen3_5_moe, qwen3_moe, qwen3_next
from .family import Family

FAMILIES: dict[str, Family] = {}
PRESETS: dict[str, ModelSpec] = {}
_BY_ARCHITECTURE: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    if family.name in FAMILIES:
        raise ValueError(f"a family named {family.name!r} is already registered")
    taken = [a for a in family.architectures if a in _BY_ARCHITECTURE] + [p for p in family.presets if p in PRESETS]
    if taken:
        raise ValueError(f"family {family.name}: {', '.join(taken)} already belong to another family")
    FAMILIES[family.name] = family
    _BY_ARCHITECTURE.update(dict.fromkeys(family.architectures, family))
    PRESETS.update(family.presets)
    return family


register_family(dense.FAMILY)
register_family(qwen3_moe.FAMILY)
register_family(deepseek_v3.FAMILY)
register_family(glm4_moe_lite.FAMILY)
register_family(qwen3_5.FAMILY)
register_family(qwen3_5_moe.FAMILY)
register_family(qwen3_next.FAMILY)


def family_of(spec: ModelSpec) -> Family:
    return FAMILIES[spec.family]


def from_hf_config(config: dict, source: str = "config.json") -> ModelSpec:
    """Read the fields IsoExec needs from a Hugging Face config dict; refuse what it cannot run."""
    architectures = config.get("architectures")
    if architectures is None:
        raise SpecError(f"{source}: missing architectures")
    if not isinstance(architectures, list) or len(architectures) != 1:
        raise SpecError(f"{source}: architectures must list exactly one class, got {architectures!r}")
    family = _BY_ARCHITECTURE.get(architectures[0])
    if family is None:
        raise SpecError(f"architectures: {architectures[0]!r} is not supported (supported: {', '.join(_BY_ARCHITECTURE)})")
    try:
        return family.from_config(config, source)
    except SpecError:
        raise
    except (TypeError, ValueError) as error:
        raise SpecError(f"{source}: {error}") from None


def read_config(directory: str | Path) -> ModelSpec:
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{directory}: not a model directory (no config.json)") from None
    except (OSError, ValueError) as error:
        raise SpecError(f"{path}: unreadable ({error})") from None
    if not isinstance(config, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return from_hf_config(config, str(path))


def is_preset(source: str | Path) -> bool:
    """Whether `source` names a preset: a preset's name that is not also a path (a path wins)."""
    return str(source) in PRESETS and not Path(source).exists()


def spec_of(source: str | Path) -> ModelSpec:
    """A preset name or a checkpoint directory -> its spec (the one reader of a `--model` argument)."""
    if is_preset(source):
        return PRESETS[str(source)]
    if not Path(source).is_dir():
        raise SpecError(f"{source!r} is neither a model preset ({', '.join(PRESETS)}) nor a checkpoint directory")
    return read_config(source)


__all__ = ["FAMILIES", "PRESETS", "Family", "family_of", "from_hf_config", "is_preset", "read_config", "register_family", "spec_of"]
