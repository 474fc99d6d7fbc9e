"""IsoExec's models inside vLLM: a `vllm.general_plugins` entry point (`plugin.register`) that registers
IsoExec's decoder for the architectures it serves, computing under an IsoExec contract over vLLM's own
scheduler and paged KV cache (docs/vllm.md). Nothing here imports vLLM until vLLM loads the plugin."""
