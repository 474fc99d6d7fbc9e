"""vLLM as the rollout engine of IsoExec's audit and RL loop: `VllmEngine` builds a vLLM `LLM` for a model and a
contract and answers what the loop asks of IsoExec's own engine — `generate` (completions with each sampled token's
log-probability and, on request, its full-vocabulary row), `fingerprint` (each worker's, for the handshake) and
`load_weights` (the trainer's weights into every worker, their SHA-256 checked on both sides).

The model reaches vLLM as a checkpoint written to a folder of the engine's own (config and safetensors, IsoExec's
`weights.save`); the contract as a JSON file named by `ISOEXEC_CONTRACT`. With `plugin=False` vLLM serves its own
model and draws with its own sampler: the control, what a user without IsoExec gets.

vLLM reads its environment once per process, so one process holds one kind of engine: the plugin's, or vLLM's own.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from ..contract.files import dump_json
from ..contract.schema import Contract
from ..engine import EngineConfig, SamplingParams
from ..engine.sequence import Completion
from ..model import Decoder
from ..model.spec import RecurrentState
from ..model.weights import save
from .draw import SEED_ARG
from .errors import VllmEngineError


def _environment(plugin: bool, contract_file: Path) -> None:
    """What vLLM reads from the environment when it builds its engine: the engine core in this process (so the
    trainer and the rollout share a machine's memory, and a test sees one process), which plugins to load, and the
    contract the plugin serves."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ["VLLM_PLUGINS"] = "isoexec" if plugin else ""
    os.environ["ISOEXEC_CONTRACT"] = str(contract_file)


CPU_BLOCK_MULTIPLE = 32
# vLLM's reference CPU MLA decode kernel takes blocks of exactly 16 tokens: where the CPU has no AMX tiles (an AMD
# EPYC, an older Xeon), vLLM's CPU platform sets the block size of an MLA model to 16 whatever it is asked for
# (vllm/platforms/cpu.py); with AMX its AMX MLA kernel takes the asked size.
CPU_MLA_BLOCK = 16


def _cpu_block(spec, page_size: int) -> int:
    """The block size vLLM's CPU backend runs a model with, for IsoExec pages of `page_size` tokens."""
    mla = any(layer.mixer.kind == "mla" for layer in spec.layers)
    if mla and not torch.cpu._is_amx_tile_supported():
        return CPU_MLA_BLOCK
    return page_size * -(-CPU_BLOCK_MULTIPLE // page_size)


class VllmEngine:
    """One vLLM engine for `model` (its spec and weights) under `contract`, sized by IsoExec's `EngineConfig`: its pages
    are vLLM's blocks (`num_pages` of `kv_page_size` tokens; on a CPU, as many blocks of 32 tokens or more),
    `prefill_chunk_size` is vLLM's token budget per step (so prefills longer than it are chunked), `cuda_graphs` off
    is vLLM's eager mode."""

    def __init__(self, model: Decoder, contract: Contract, config: EngineConfig, *, plugin: bool = True, device: str = "cpu",
                 workdir: str | Path | None = None):
        self.plugin, self.spec, self.device = plugin, model.spec, str(device)
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="isoexec-vllm-")
        workdir = Path(workdir if workdir is not None else self._tmp.name)
        checkpoint = save(model, workdir / "checkpoint")
        contract_file = workdir / "contract.json"
        contract_file.write_text(dump_json(contract), "utf-8")
        _environment(plugin, contract_file)
        from vllm import LLM

        from . import plugin as served

        budget = config.prefill_chunk_size
        # vLLM's own CPU attention (the control's) takes blocks of a multiple of 32 tokens (an MLA model's: see
        # `_cpu_block`): pages of fewer go in pairs (or more), under the plugin too, so that both engines run the same
        # workload.
        block = _cpu_block(model.spec, config.kv_page_size) if self.device == "cpu" else config.kv_page_size
        blocks = -(-config.num_pages * config.kv_page_size // block)
        # Per-sequence (gdn) state goes without prefix caching in vLLM (model.py refuses it), and vLLM sizes such a model's
        # blocks by its state pages (hundreds of tokens), so a count of blocks of `block` tokens means nothing there:
        # vLLM takes its cache from VLLM_CPU_KVCACHE_SPACE instead.
        recurrent = any(isinstance(layer.state(), RecurrentState) for layer in model.spec.layers)
        try:
            self.llm = LLM(model=str(checkpoint), skip_tokenizer_init=True, dtype=model.spec.dtype, seed=0,
                           max_model_len=min(model.spec.max_position_embeddings, blocks * block), block_size=block,
                           num_gpu_blocks_override=None if recurrent else blocks + 1,  # vLLM keeps one block back (its null block)
                           max_num_seqs=min(config.max_num_seqs, budget),
                           max_num_batched_tokens=budget, enable_chunked_prefill=True, enable_prefix_caching=config.prefix_caching and not recurrent,
                           enforce_eager=not config.cuda_graphs, max_logprobs=-1, disable_log_stats=False,
                           logprobs_mode="raw_logits" if plugin else "raw_logprobs",
                           worker_extension_cls="isoexec.vllm.worker.WorkerExtension")
        except Exception as error:  # noqa: BLE001 (vLLM raises many kinds; each is one line for the user)
            raise VllmEngineError(f"vLLM could not build its engine for {model.spec.architecture}: {str(error).splitlines()[0]}") from error
        if served.registered != plugin:
            raise VllmEngineError("this process loaded vLLM's plugins before with other settings; one process runs either IsoExec's "
                                  "model in vLLM or vLLM's own, not both")

    def fingerprint(self) -> list[dict | None]:
        """Each worker's fingerprint (None where vLLM serves its own model)."""
        return self.llm.collective_rpc("isoexec_fingerprint")

    def digest(self) -> list[str | None]:
        """The SHA-256 of the weights each worker serves."""
        return self.llm.collective_rpc("isoexec_digest")

    def load_weights(self, tensors: dict[str, torch.Tensor], digest: str) -> str:
        """The trainer's weights (IsoExec's names, `rl.sync.state_bytes`) into every worker, each checking their SHA-256
        against `digest`; the prefix cache is emptied, since its keys were computed with the old weights."""
        received = set(self.llm.collective_rpc("isoexec_load_state", args=(tensors, digest)))
        if received != {digest}:
            raise VllmEngineError(f"weights arrived differently in vLLM's workers: sent {digest}, received {sorted(received)}")
        if not self.llm.reset_prefix_cache():
            raise VllmEngineError("vLLM could not empty its prefix cache after the weights changed")
        return digest

    def generate(self, prompts: list[list[int]], params: list[SamplingParams] | SamplingParams, progress: bool = False) -> list[Completion]:
        """IsoExec's `LLMEngine.generate` through vLLM: request i's seed (its own, or i where it has none, as IsoExec's
        engine derives it) is the contract's draw's under the plugin (`draw.ContractDraw`); vLLM's own sampler draws
        the control's unseeded."""
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt

        params = params if isinstance(params, list) else [params] * len(prompts)
        asked = []
        for i, p in enumerate(params):
            seed = p.seed if p.seed is not None else i
            asked.append(VllmParams(temperature=p.temperature, top_k=p.top_k if p.top_k > 0 else -1, top_p=p.top_p, max_tokens=p.max_tokens,
                                    stop_token_ids=list(p.stop_token_ids), ignore_eos=p.ignore_eos, detokenize=False,
                                    logprobs=-1 if p.return_full_logprobs else 0,
                                    extra_args={SEED_ARG: seed} if self.plugin else None))
        try:
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], asked, use_tqdm=progress)
        except Exception as error:  # noqa: BLE001 (vLLM's own errors, e.g. a head size its CPU attention lacks)
            last = [line for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
            raise VllmEngineError(f"vLLM failed to generate: {last[-1]}") from error
        self.cached_tokens = [o.num_cached_tokens or 0 for o in outputs]
        return [self._completion(i, list(prompt), p, o.outputs[0]) for i, (prompt, p, o) in enumerate(zip(prompts, params, outputs))]

    def _completion(self, index: int, prompt: list[int], params: SamplingParams, out) -> Completion:
        tokens = list(out.token_ids)
        logprobs = torch.tensor([row[t].logprob for row, t in zip(out.logprobs, tokens)], dtype=torch.float32)
        full = None
        if params.return_full_logprobs:
            full = torch.empty(len(tokens), self.spec.vocab_size, dtype=torch.float32)
            for n, row in enumerate(out.logprobs):
                ids = torch.tensor(list(row.keys()))
                full[n, ids] = torch.tensor([entry.logprob for entry in row.values()], dtype=torch.float32)
        return Completion(index, prompt, tokens, logprobs, full, "stop" if out.finish_reason == "stop" else "length")

    def stats(self) -> dict:
        """vLLM's counters of the engine's life: preemptions, prefix-cache hits, prompt and generated tokens."""
        wanted = {"vllm:num_preemptions": "preemptions", "vllm:prompt_tokens": "prompt_tokens", "vllm:generation_tokens": "decode_tokens",
                  "vllm:prefix_cache_hits": "prefix_cache_hit_tokens"}
        out = {}
        for metric in self.llm.get_metrics():
            if metric.name in wanted and hasattr(metric, "value"):
                out[wanted[metric.name]] = int(metric.value)
        return out

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
