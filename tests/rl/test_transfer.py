"""The weight sync's buckets (`rl/transfer.py`): names in order, bytes through shared memory unchanged, the digest
taken bucket by bucket equal to the whole state's, and a corrupted bucket caught by it."""

import multiprocessing

import numpy as np
import pytest
import torch

from isoexec.model import PRESETS
from isoexec.parallel.weights import weight_shapes
from isoexec.rl import RLConfig, RLRun
from isoexec.rl.parallel_mode import start_run
from isoexec.rl.loop import Learner, Rollout
from isoexec.rl.sync import Digest, state_digest, weights_digest
from isoexec.rl.transfer import ALIGN, Outbox, _attach, buckets, opened


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def test_buckets_hold_every_weight_once_in_name_order_within_the_limit():
    spec = PRESETS["tiny-moe"]
    shapes = weight_shapes(spec)
    limit = 4 * ALIGN * 64
    runs = buckets(spec, limit)
    assert [name for run in runs for name in run] == sorted(shapes) and len(runs) > 2
    for run in runs:
        sizes = [shapes[n][0].numel() * shapes[n][1].itemsize for n in run]
        assert len(run) == 1 or sum(-(-s // ALIGN) * ALIGN for s in sizes) <= limit


def _read(bucket, queue, device="cpu"):
    """In another process: what the bucket holds, as (dtype, bits) by value (a tensor put on a queue would be shared
    memory of this process, gone when it exits)."""
    with opened(bucket, torch.device(device)) as tensors:
        assert all(t.device.type == device for t in tensors.values())
        queue.put({name: (t.dtype, _bits(t).cpu().numpy()) for name, t in tensors.items()})


def test_a_bucket_reaches_another_process_bit_for_bit_and_is_freed():
    tensors = {"a.weight": torch.randn(3, 5, dtype=torch.bfloat16), "b.bias": torch.randn(7), "c": torch.arange(5, dtype=torch.int64),
               "d.empty": torch.empty(0, 4)}
    tensors["b.bias"][0] = float("nan")
    outbox = Outbox()
    bucket = outbox.publish(tensors, torch.device("cpu"))
    assert bucket.names == sorted(tensors) and all(offset % ALIGN == 0 for *_, offset in bucket.layout)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    reader = context.Process(target=_read, args=(bucket, queue))
    reader.start()
    received = queue.get(timeout=120)
    reader.join(timeout=60)
    assert reader.exitcode == 0
    for name, t in tensors.items():
        assert received[name][0] == t.dtype and np.array_equal(received[name][1], _bits(t).numpy())
    outbox.release()
    with pytest.raises(FileNotFoundError):
        with opened(bucket, torch.device("cpu")):
            pass


def test_the_digest_taken_bucket_by_bucket_is_the_whole_states():
    state = {f"w{i}": torch.randn(i + 1, 3) for i in range(6)}
    for folded in (False, True):
        digest = Digest(folded)
        for names in (["w0", "w1"], ["w2"], ["w3", "w4", "w5"]):
            digest.update({n: state[n] for n in names})
        assert digest.hexdigest() == state_digest(state, folded)
    with pytest.raises(ValueError, match="name order"):
        Digest().update({"w3": state["w3"]}).update({"w1": state["w1"]})


def test_the_sides_pass_weights_by_buckets_and_a_corrupted_one_is_caught():
    """The trainer's and engine's ends of the bucketed sync, each in this process (a one-rank side): the engine ends
    with the trainer's weights and both digests are the whole model's; a byte changed in a bucket after it was
    published changes the engine's digest (the driver's check, `parallel_mode.GroupLearner.send_weights`, refuses
    the sync then)."""
    config = RLConfig(model="tiny-dense", warmup_steps=0, steps=1, prompts_per_step=1, group_size=2, max_new_tokens=4)
    learner, rollout = Learner(config), Rollout(config)
    with torch.no_grad():
        for t in rollout.model.parameters():
            t.zero_()
    runs = buckets(learner.spec, limit=1 << 14)
    assert len(runs) > 1
    for names in runs:
        rollout.receive_bucket(learner.send_bucket(names))
    sent, received = learner.finish_send(), rollout.finish_receive()
    assert sent == received == weights_digest(learner.policy) == weights_digest(rollout.model)
    for names in runs:
        bucket = learner.send_bucket(names)
        if "model.norm.weight" in names:  # not lm_head: tied to the embedding, the embedding's copy would overwrite it
            _flip_a_bit(bucket, "model.norm.weight")
        rollout.receive_bucket(bucket)
    assert learner.finish_send() == sent != rollout.finish_receive()


def _flip_a_bit(bucket, name: str):
    shm = _attach(bucket.where[1])
    shm.buf[next(offset for n, *_, offset in bucket.layout if n == name)] ^= 1
    shm.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_bucket_on_a_gpu_reaches_another_process_through_cuda_ipc():
    """The trainer's device buffer, opened in another process by its IPC handle (the engine's ranks, which on one
    GPU share the trainer's device): the bytes arrive unchanged, and the trainer frees the buffer after."""
    tensors = {"a.weight": torch.randn(300, 70, dtype=torch.bfloat16, device="cuda"), "b.bias": torch.randn(17, device="cuda")}
    outbox = Outbox()
    bucket = outbox.publish(tensors, torch.device("cuda"))
    assert bucket.where[0] == "cuda"
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    reader = context.Process(target=_read, args=(bucket, queue, "cuda"))
    reader.start()
    received = queue.get(timeout=300)
    reader.join(timeout=60)
    assert reader.exitcode == 0
    for name, t in tensors.items():
        assert received[name][0] == t.dtype and np.array_equal(received[name][1], _bits(t).cpu().numpy())
    outbox.release()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_parallel_run_on_a_gpu_passes_weights_rank_to_rank():
    """Trainer TP 2 and engine TP 2, every rank on this one GPU (gloo): the buckets cross by CUDA IPC, the digest
    of the engine's shards put together again is the trainer's and an in-process run's, and a step is bitwise."""
    config = RLConfig(model="tiny-dense", warmup_steps=0, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, algorithm="grpo",
                      device="cuda", contract="tiny-dense-triton", trainer_tp=2, engine_tp=2)
    run = start_run(config)
    try:
        assert run.send_weights is not None and run.weights.startswith("fold-sha256:")
        assert run.weights == RLRun(config.replace(trainer_tp=1, engine_tp=1)).weights
        metrics = run.run_step()
        assert metrics["tokens"] > 0 and metrics["bitwise_equal_fraction"] == 1.0
    finally:
        run.close()
