"""What IsoExec's trainer asks of each vLLM worker, by name through `collective_rpc`: vLLM mixes this class into
its worker class when the engine is built with `worker_extension_cls="isoexec.vllm.worker.WorkerExtension"`.
Methods called by name need no pickled code in the workers (vLLM refuses that unless
VLLM_ALLOW_INSECURE_SERIALIZATION is set), so the same calls serve an in-process engine and a multi-process one."""
from __future__ import annotations

import torch



class WorkerExtension:
    def _isoexec_model(self):
        from .model import IsoExecForCausalLM

        model = self.model_runner.get_model()
        return model if isinstance(model, IsoExecForCausalLM) else None

    def isoexec_fingerprint(self) -> dict | None:
        """This worker's fingerprint (`model.IsoExecForCausalLM.fingerprint`); None where vLLM serves its own model."""
        model = self._isoexec_model()
        return None if model is None else model.fingerprint()

    def isoexec_load_state(self, tensors: dict[str, torch.Tensor], digest: str) -> str:
        """Load the trainer's weights (IsoExec's names) into this worker's model; returns their SHA-256 here, which
        `rl.sync.load_state` has checked against the sender's `digest`."""
        model = self._isoexec_model()
        if model is None:
            raise RuntimeError("this vLLM worker serves vLLM's own model, not IsoExec's: the weights go through vLLM's loader")
        return model.load_state(tensors, digest)

    def isoexec_digest(self) -> str | None:
        """The SHA-256 of the weights this worker serves (IsoExec's model only)."""
        model = self._isoexec_model()
        return None if model is None else model.digest()
