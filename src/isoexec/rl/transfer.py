"""Weight sync between two parallel sides with the driver out of the data's path.

The trainer's ranks put together the whole of a bucket of weights (`buckets`: consecutive names, in name order,
up to BUCKET_BYTES), its rank 0 packs them into one flat buffer that every engine rank can read (`Outbox`), and
the driver passes on only a `Bucket`: where the buffer is and each tensor's place in it. Each engine rank reads
the bucket (`opened`), cuts its own shards and lets the bucket go; the trainer frees it when it packs the next.
A 35B-parameter policy is 70 GB in bfloat16: pickled through the driver whole, as the first parallel sync was,
it would cross three processes' memory every step; here no process holds more than a bucket beyond its shards.

The buffer is POSIX shared memory on a CPU, and on a GPU the trainer's device memory, opened by each engine rank
through a CUDA IPC handle (`torch.multiprocessing.reductions`): ranks on the same GPU read it in place, ranks on
others copy it over NVLink or PCIe. Both need the two sides on one host, as `parallel.RankGroup` starts them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import torch
from torch.multiprocessing.reductions import reduce_tensor

from ..model import ModelSpec
from ..parallel.weights import weight_shapes

BUCKET_BYTES = 1 << 29  # 512 MiB: a few hundred buckets for a 35B model, each a fraction of a rank's free memory
ALIGN = 64  # every tensor starts on a 64-byte boundary of the buffer, so each is a view of its dtype


@dataclass(frozen=True)
class Bucket:
    """A published bucket: `where` its bytes are (("shm", name) or ("cuda", rebuild, args) for
    `torch.multiprocessing`'s rebuild of the trainer's buffer) and each tensor's (name, dtype, shape, offset)."""

    where: tuple
    layout: tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]
    nbytes: int

    @property
    def names(self) -> list[str]:
        return [name for name, *_ in self.layout]


def buckets(spec: ModelSpec, limit: int = BUCKET_BYTES) -> list[list[str]]:
    """The model's weight names in name order, cut into runs of at most `limit` bytes (a larger weight alone)."""
    runs, size = [[]], 0
    for name, (shape, dtype) in sorted(weight_shapes(spec).items()):
        nbytes = shape.numel() * dtype.itemsize
        if runs[-1] and size + nbytes > limit:
            runs.append([])
            size = 0
        runs[-1].append(name)
        size += -(-nbytes // ALIGN) * ALIGN
    return [run for run in runs if run]


def _layout(tensors: dict[str, torch.Tensor]) -> tuple[tuple, int]:
    layout, offset = [], 0
    for name, t in sorted(tensors.items()):
        layout.append((name, t.dtype, tuple(t.shape), offset))
        offset += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return tuple(layout), offset


def _views(flat: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """Each tensor of `layout` as a view of the flat uint8 buffer."""
    out = {}
    for name, dtype, shape, offset in layout:
        count = torch.Size(shape).numel() * dtype.itemsize
        out[name] = flat[offset : offset + count].view(dtype).view(shape)
    return out


def _pack(flat: torch.Tensor, layout, tensors: dict[str, torch.Tensor]) -> None:
    for name, view in _views(flat, layout).items():
        view.copy_(tensors[name])


class Outbox:
    """The trainer's rank 0's end: the bucket it published last, kept until the next `publish` or `release`."""

    def __init__(self):
        self._held = None

    def publish(self, tensors: dict[str, torch.Tensor], device: torch.device) -> Bucket:
        self.release()
        layout, nbytes = _layout(tensors)
        if device.type == "cuda":
            flat = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
            _pack(flat, layout, tensors)
            self._held = flat
            return Bucket(("cuda", *reduce_tensor(flat)), layout, nbytes)
        shm = SharedMemory(create=True, size=max(nbytes, 1))
        self._held = shm
        # A temporary view: none may outlive the call, since close() refuses while one is exported.
        _pack(torch.frombuffer(shm.buf, dtype=torch.uint8, count=max(nbytes, 1)), layout, tensors)
        return Bucket(("shm", shm.name), layout, nbytes)

    def release(self) -> None:
        held, self._held = self._held, None
        if isinstance(held, SharedMemory):
            held.close()
            held.unlink()
        elif held is not None:
            del held
            torch.cuda.ipc_collect()  # the engine's ranks have dropped their handles: the memory can go


def _attach(name: str) -> SharedMemory:
    """The trainer's segment, not tracked here: the trainer unlinks it. Before Python 3.13 attaching registers the
    name with the resource tracker, which `RankGroup`'s processes share with the trainer's (the name is already
    there, and the trainer's unlink removes it)."""
    try:
        return SharedMemory(name=name, track=False)
    except TypeError:
        return SharedMemory(name=name)


@contextlib.contextmanager
def opened(bucket: Bucket, device: torch.device):
    """The bucket's tensors on `device` (this rank's copy of the bytes: the trainer may free its buffer after)."""
    if bucket.where[0] == "cuda":
        _, rebuild, args = bucket.where
        shared = rebuild(*args)
        flat = shared.to(device, copy=True)
        del shared
    else:
        shm = _attach(bucket.where[1])
        try:
            flat = torch.frombuffer(shm.buf, dtype=torch.uint8, count=max(bucket.nbytes, 1)).clone().to(device)
        finally:
            shm.close()
    yield _views(flat, bucket.layout)
