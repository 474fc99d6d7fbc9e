"""How every section of bench.py times: kernels by median of many launches, whole steps by wall clock.

On CUDA, `kernel_ms` is `triton.testing.do_bench` (CUDA events, L2 flushed between launches); on the
CPU (the `--small` smoke run) both functions take time.perf_counter medians.
"""

import statistics
import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kernel_ms(fn, device: torch.device) -> float:
    """Median time of one call of fn (short: microseconds to tens of milliseconds), in ms."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    return wall_ms(fn, device, reps=5)


def wall_ms(fn, device: torch.device, reps: int = 3) -> float:
    """Median wall time of fn after one warm-up call, in ms; for calls too slow for do_bench's
    dozens of repetitions (a training step, a whole generate)."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
