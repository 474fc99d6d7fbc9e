"""What a family is: how its config.json reads into a `ModelSpec`, how the spec writes back, which
checkpoint keys it does not use, its IsoExec contract and its named presets."""

from dataclasses import dataclass, field
from typing import Callable

from ..spec import ModelSpec, SpecError


@dataclass(frozen=True, kw_only=True)
class Family:
    name: str
    architectures: tuple[str, ...]  # the `architectures` entries of config.json it reads
    from_config: Callable[[dict, str], ModelSpec]  # (config, source for messages) -> spec
    to_hf_config: Callable[[ModelSpec], dict]
    contract: str  # the contract preset this family's models run under by default
    presets: dict[str, ModelSpec] = field(default_factory=dict)
    # Checkpoint keys under these prefixes are read past (one logged line says how many), not loaded.
    ignored_prefixes: Callable[[ModelSpec], tuple[str, ...]] = lambda spec: ()
    # The checkpoint's tensors -> the modules' names and layout, for checkpoints that name, split or fuse differently.
    adapt: Callable[[dict, ModelSpec], dict] = lambda tensors, spec: tensors
    # The inverse, where `save` must write the checkpoint's layout rather than the modules' (fused projections).
    export: Callable[[dict, ModelSpec], dict] = lambda tensors, spec: tensors


def config_reader(config: dict, source: str):
    """get(name, default=None, required=True): a config field, or a SpecError naming it."""

    def get(name, default=None, required=True):
        if name in config:
            return config[name]
        if required and default is None:
            raise SpecError(f"{source}: missing {name}")
        return default

    return get
