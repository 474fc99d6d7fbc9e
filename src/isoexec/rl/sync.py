"""Weight sync from the trainer to the engine, verified by SHA-256 digests computed on both sides."""

import hashlib

import torch


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter's name, dtype, shape and bytes, in name order."""
    return state_digest(model.state_dict())


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """`weights_digest` of a state dict."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + digest.hexdigest()


class WeightSyncError(RuntimeError):
    pass


def sync_in_process(trainer_model: torch.nn.Module, engine_model: torch.nn.Module) -> str:
    """Copy the trainer's weights into the engine's model; both digests must agree."""
    with torch.no_grad():
        source = trainer_model.state_dict()
        for name, target in engine_model.state_dict().items():
            target.copy_(source[name])
    sent, received = weights_digest(trainer_model), weights_digest(engine_model)
    if sent != received:
        raise WeightSyncError(f"weight sync corrupted the weights: trainer {sent}, engine {received}")
    return sent


def state_bytes(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights as CPU tensors, for sending to another process."""
    return {name: t.detach().cpu().clone() for name, t in model.state_dict().items()}


def load_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor], expected_digest: str) -> str:
    """Load weights received from another process and check them against the sender's digest."""
    with torch.no_grad():
        for name, target in model.state_dict().items():
            target.copy_(tensors[name])
    received = weights_digest(model)
    if received != expected_digest:
        raise WeightSyncError(f"weights arrived corrupted: sender {expected_digest}, receiver {received}")
    return received
