"""The audit's rollout in vLLM (`isoexec audit --engine vllm | vllm-own`): the audit's workload and engine sizes
through `engine.VllmEngine`, after the handshake with the trainer and a check that vLLM serves the trainer's weights."""
from __future__ import annotations

from ..contract.schema import Contract
from ..engine import EngineConfig, SamplingParams
from ..model import Decoder
from ..rl.handshake import ensure_admitted, side_fingerprint
from ..rl.sync import weights_digest
from ..runtime import check
from ..trainer import Trainer
from .engine import VllmEngine
from .errors import VllmEngineError


def roll_out(model: Decoder, contract: Contract, config: EngineConfig, prompts: list[list[int]], params: list[SamplingParams], *,
             plugin: bool, device: str = "cpu", progress: bool = True):
    """(completions, the engine's counters, its layout) as `audit.run` takes them from IsoExec's engine. Under the
    plugin every worker must pass the handshake (HandshakeRefused otherwise) against the trainer's fingerprint and serve weights whose SHA-256 is
    the trainer's; vLLM's own model (`plugin=False`) has neither to offer."""
    import vllm

    engine = VllmEngine(model, contract, config, plugin=plugin, device=device)
    try:
        if plugin:
            ensure_admitted(contract, device, spec=model.spec)  # as the RL loop does before its handshake
            trainer = side_fingerprint(Trainer(model, contract).binding, "trainer", device=device, spec=model.spec)
            for worker in engine.fingerprint():
                if worker is None:
                    raise VllmEngineError(f"vLLM serves its own model for {model.spec.architecture}, not IsoExec's: is the isoexec "
                                          "plugin installed and in VLLM_PLUGINS?")
                check(trainer, worker).raise_if_refused()
            digests, sent = set(engine.digest()), weights_digest(model)
            if digests != {sent}:
                raise VllmEngineError(f"vLLM serves other weights than the trainer's: trainer {sent}, vLLM {sorted(digests)}")
        completions = engine.generate(prompts, params, progress=progress)
        stats = {"engine": f"vllm {vllm.__version__}" + ("" if plugin else " (its own model and sampler)"), **engine.stats()}
    finally:
        engine.close()
    return completions, stats, {"tp": 1, "ep": 1, "sp": False, "dp": 1}


class VllmRollout:
    """The RL loop's engine side (`rl.loop.Rollout`'s methods) in vLLM: the policy's shape under the run's contract,
    its weights only ever the trainer's (`load_weights`, every step, before any rollout)."""

    def __init__(self, config):
        from ..rl.loop import initial_model, longest_prompt, setup

        task, self.spec, self.contract = setup(config)
        page = self.contract.deployment.engine.kv_page_size
        pages = config.prompts_per_step * config.group_size * -(-(longest_prompt(task) + config.max_new_tokens) // page)
        self.engine = VllmEngine(initial_model(config, self.spec), self.contract, EngineConfig.from_contract(self.contract, num_pages=pages + 1))

    def fingerprint(self) -> dict:
        """The workers' fingerprint: all of them run the same, or vLLM serves something else than asked."""
        found = self.engine.fingerprint()
        if any(f is None for f in found):
            raise VllmEngineError("vLLM serves its own model, not IsoExec's: is the isoexec plugin installed and in VLLM_PLUGINS?")
        if any(f != found[0] for f in found[1:]):
            raise VllmEngineError(f"vLLM's {len(found)} workers run different things; the handshake takes one engine fingerprint")
        return found[0]

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params)

    def load_weights(self, tensors: dict, digest: str) -> str:
        return self.engine.load_weights(tensors, digest)

    def close(self) -> None:
        self.engine.close()
