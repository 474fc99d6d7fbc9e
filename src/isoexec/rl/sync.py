"""Weight sync from the trainer to the engine, verified by digests computed on both sides.

On a CPU the digest is a SHA-256 over the weights' bytes. On a GPU, hashing every byte on the host would
cost seconds a step (a 3B-parameter policy is 6 GB to copy out and hash), so each tensor is first folded on
its device into two exact integer checksums per chunk of 2^20 16-bit words (`fold`), and the SHA-256 runs over
those: a digest of the form "fold-sha256:…". It catches what a transfer can do to weights (a changed,
lost, zeroed or misplaced word changes a checksum unless the change is orthogonal to both weight vectors),
not a deliberate forgery. Both sides of a run use the same form, chosen by where the run computes.
"""

import hashlib

import torch

FOLD_CHUNK = 1 << 20
FOLD_SLAB = 16  # chunks widened to int64 at a time: 128 MiB, and 256 MiB of products


def weights_digest(model: torch.nn.Module, folded: bool = False) -> str:
    """The digest over every parameter's name, dtype, shape and contents, in name order."""
    return state_digest(model.state_dict(), folded)


def state_digest(state: dict[str, torch.Tensor], folded: bool = False) -> str:
    """`weights_digest` of a state dict: SHA-256 over the bytes, or with `folded` over each tensor's `fold`."""
    return Digest(folded).update(state).hexdigest()


class Digest:
    """`state_digest` taken a few tensors at a time (the weight sync's buckets, `transfer.py`): the same digest as
    over the whole state when the calls come in name order."""

    def __init__(self, folded: bool = False):
        self.folded, self._sha, self._last = folded, hashlib.sha256(), None

    def update(self, state: dict[str, torch.Tensor]) -> "Digest":
        items = sorted(state.items())
        if items and self._last is not None and items[0][0] <= self._last:
            raise ValueError(f"Digest.update: {items[0][0]!r} comes after {self._last!r} was digested; give the tensors in name order")
        if self.folded:  # every tensor's checksums cross to the host in one copy (one wait for the device, not one a tensor)
            folds = [fold(tensor.detach().contiguous()) for _, tensor in items]
            host = torch.cat([f.reshape(-1) for f in folds]).cpu().split([f.numel() for f in folds]) if folds else []
        for i, (name, tensor) in enumerate(items):
            t = tensor.detach()
            self._sha.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            if self.folded:
                self._sha.update(host[i].numpy().tobytes())
            else:
                self._sha.update(t.contiguous().cpu().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            self._last = name
        return self

    def hexdigest(self) -> str:
        return ("fold-sha256:" if self.folded else "sha256:") + self._sha.hexdigest()


def fold(t: torch.Tensor) -> torch.Tensor:
    """[2, chunks] int64 on t's device: per chunk of 2^20 signed 16-bit words of t's bytes (zero-padded),
    sum_j w_j (2j + 1) and sum_j w_j m_j with m_j odd multipliers in [1, 2^17) that vary pseudo-randomly with j.
    Every product is below 2^36 and a chunk's sum below 2^56 in magnitude: exact in int64 on any device, in any
    reduction order. Folded FOLD_SLAB chunks at a time: a whole expert tensor widened to int64 at once would
    take several times its size in device memory."""
    words = t.reshape(-1).view(torch.uint8)
    if words.numel() % 2:
        words = torch.cat([words, words.new_zeros(1)])
    words = words.view(torch.int16)
    chunks = max(1, -(-words.numel() // FOLD_CHUNK))
    words = torch.nn.functional.pad(words, (0, chunks * FOLD_CHUNK - words.numel())).view(chunks, FOLD_CHUNK)
    j = torch.arange(FOLD_CHUNK, device=t.device, dtype=torch.int64)
    weights = torch.stack([2 * j + 1, ((j * 40503 + 12345) % 65536) * 2 + 1])  # [2, FOLD_CHUNK], odd, < 2^21 and < 2^17
    # Products and sums, not a matmul: CUDA has no int64 matmul.
    slabs = [(words[i : i + FOLD_SLAB].to(torch.int64)[:, None, :] * weights).sum(-1) for i in range(0, chunks, FOLD_SLAB)]  # [slab, 2]
    return torch.cat(slabs).T.contiguous()


class WeightSyncError(RuntimeError):
    pass


def sync_in_process(trainer_model: torch.nn.Module, engine_model: torch.nn.Module, folded: bool = False) -> str:
    """Copy the trainer's weights into the engine's model; both digests must agree."""
    with torch.no_grad():
        source = trainer_model.state_dict()
        for name, target in engine_model.state_dict().items():
            target.copy_(source[name])
    sent, received = weights_digest(trainer_model, folded), weights_digest(engine_model, folded)
    if sent != received:
        raise WeightSyncError(f"weight sync corrupted the weights: trainer {sent}, engine {received}")
    return sent


def state_bytes(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights as CPU tensors, for sending to another process."""
    return {name: t.detach().cpu().clone() for name, t in model.state_dict().items()}


def load_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor], expected_digest: str, folded: bool = False) -> str:
    """Load weights received from another process (or, on one GPU, the trainer's own tensors) and check them
    against the sender's digest."""
    with torch.no_grad():
        for name, target in model.state_dict().items():
            target.copy_(tensors[name])
    received = weights_digest(model, folded)
    if received != expected_digest:
        raise WeightSyncError(f"weights arrived corrupted: sender {expected_digest}, receiver {received}")
    return received
