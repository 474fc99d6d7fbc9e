"""How every section of bench.py times: kernels by median of many launches, whole steps by wall clock.

On CUDA, `kernel_ms` is `triton.testing.do_bench` (CUDA events, L2 flushed between launches); on the
CPU (the `--small` smoke run) both functions take time.perf_counter medians. `device_ms` sums a call's kernels under
torch.profiler: the device's time for calls that cannot be captured, whose eager time may be the host's.
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


def device_ms(fn, device: torch.device, reps: int = 10) -> float | None:
    """The device time of one call of fn's kernels, summed under torch.profiler (no launch gaps, no host time), in ms:
    for calls that cannot be captured in a CUDA graph and whose eager time is the host's. None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize(device)
    # Device-side events alone (kernels, copies, fills): an op's CPU event carries its kernels' time as well.
    kernels = (e for e in prof.key_averages() if e.self_device_time_total > 0 and e.self_cpu_time_total == 0)
    return sum(e.self_device_time_total for e in kernels) / reps / 1000


def graphed_ms(fn, device: torch.device) -> float:
    """Median time of one replay of fn captured in a CUDA graph, in ms: the device's time without the
    host's launch cost (as the engine's decode graphs run). On the CPU, `kernel_ms`."""
    if device.type != "cuda":
        return kernel_ms(fn, device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()  # compiles, and allocates outside the capture
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return kernel_ms(graph.replay, device)


def wall_ms(fn, device: torch.device, reps: int = 3, warmup: bool = True) -> float:
    """Median wall time of fn (after one warm-up call unless told not to), in ms; for calls too slow
    for do_bench's dozens of repetitions (a training step, a whole generate)."""
    if warmup:
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
