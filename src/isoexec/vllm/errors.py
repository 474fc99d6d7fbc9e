"""The vLLM side's errors, importable where vLLM is not installed (the CLI catches them)."""


class VllmEngineError(RuntimeError):
    """vLLM could not be built, or built something other than what was asked (other weights, another contract)."""
