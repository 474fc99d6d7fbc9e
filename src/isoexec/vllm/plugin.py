"""The entry point vLLM calls in every process it starts (`vllm.general_plugins`, pyproject.toml): checks the
vLLM version and registers `model.IsoExecForCausalLM` for the architectures it serves. vLLM loads every
installed plugin unless `VLLM_PLUGINS` names the ones to load; `VLLM_PLUGINS=""` runs vLLM's own models."""
from __future__ import annotations

# The vLLM releases whose model and attention interfaces `model.py` is written against.
SUPPORTED_VLLM = ("0.32.",)
# Decoders whose every layer is causal GQA attention and an MLP (the dense family's architectures):
# their whole state is the paged KV cache vLLM already keeps.
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")


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
    for architecture in ARCHITECTURES:
        ModelRegistry.register_model(architecture, "isoexec.vllm.model:IsoExecForCausalLM")
    registered = True
