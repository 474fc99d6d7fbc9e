"""The entry point vLLM calls in every process it starts (`vllm.general_plugins`, pyproject.toml): checks the
vLLM version and registers `model.IsoExecForCausalLM` for the architectures it serves. vLLM loads every
installed plugin unless `VLLM_PLUGINS` names the ones to load; `VLLM_PLUGINS=""` runs vLLM's own models."""
from __future__ import annotations

# The vLLM releases whose model and attention interfaces `model.py` is written against.
SUPPORTED_VLLM = ("0.32.",)


def architectures() -> tuple[str, ...]:
    """Every text decoder architecture of IsoExec's families: registered for vLLM whether or not the plugin can serve
    all of its layers yet, so that one it cannot is refused when vLLM builds it (`model.IsoExecForCausalLM`), never
    served by vLLM's own model in the belief that it is IsoExec's."""
    from ..model.families import FAMILIES

    return tuple(a for family in FAMILIES.values() for a in family.architectures if a.endswith("ForCausalLM"))


def hybrid_architectures() -> tuple[str, ...]:
    """Those of families whose layers keep per-sequence state (gdn): vLLM must know them as hybrid models by their class."""
    from ..model.families import FAMILIES
    from ..model.spec import RecurrentState

    return tuple(a for family in FAMILIES.values() if any(isinstance(layer.state(), RecurrentState) for preset in family.presets.values()
                                                            for layer in preset.layers)
                 for a in family.architectures if a.endswith("ForCausalLM"))


# Whether `register` ran in this process: `draw.ContractDraw`, which vLLM loads from its own entry point group
# whatever VLLM_PLUGINS says, acts only where the plugin serves the model.
registered = False


class UnsupportedVllm(RuntimeError):
    """An installed vLLM the plugin was not written against."""


def check_version(version: str) -> None:
    if not version.startswith(SUPPORTED_VLLM):
        raise UnsupportedVllm(f"isoexec's vLLM plugin supports vLLM {', '.join(v + 'x' for v in SUPPORTED_VLLM)}, "
                              f"found {version}; run vLLM's own models with VLLM_PLUGINS=\"\"")


def register() -> None:
    global registered
    import vllm
    from vllm import ModelRegistry

    check_version(vllm.__version__)
    from vllm.v1.attention.backends.registry import register_backend

    from .attention import NAME

    register_backend(NAME, "isoexec.vllm.attention.IsoExecAttentionBackend")
    hybrid = hybrid_architectures()
    for architecture in architectures():
        model = "IsoExecHybridForCausalLM" if architecture in hybrid else "IsoExecForCausalLM"
        ModelRegistry.register_model(architecture, f"isoexec.vllm.model:{model}")
    registered = True
