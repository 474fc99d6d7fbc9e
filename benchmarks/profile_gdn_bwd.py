"""Where gdn.core.triton's forward + backward spends its GPU time: the kernels of one training step under
torch.profiler, per shape, summed by kernel name (bench.py gdn times the whole step; this splits it); with
`--sweep`, the step's time under each of the backward's own tiles (chunk, value block, the walks' block, inputs and loop, warps, one chunk
kernel or two, bf16 buffers or fp32, the walks in one launch or two) at the first shape (or `--shapes`), every configuration's gradients compared with the first's. Each profile
gives the step's time as bench.py takes it and back to back beside its kernels' sum, the host's costliest
ops, and the backward kernels' registers, spills and shared memory as compiled.

    cd benchmarks && PYTHONPATH=../src python3 profile_gdn_bwd.py [--sweep [--configs 0,9,12]] [--fla] [--shapes hk16-hv16-d128,...]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from gdn import GPU, SHAPES, _contract_op, _fla, _fla_chunk, _inputs, _lift_fla_backward_guard
from isoexec.ops.gdn import triton_bwd
from timing import kernel_ms

# Chunks of 64 take value blocks of 64 or more (triton_bwd's note); 4 warps spill at 64. The first row is the default.
_C64 = dict(CHUNK=64, BLOCK_V=64, WALK_BLOCK_V=None, WALK_INPUTS=False, WALK_STAGES=0, NUM_WARPS=4, CHUNK_WARPS=8, SPLIT=True, BF16_BUFFERS=True,
            ONE_WALK_LAUNCH=True)
_C32 = dict(_C64, CHUNK=32, BLOCK_V=32, CHUNK_WARPS=4)
# The walks in narrower blocks than the chunk kernels' come last: were chunks of 64 with 32 columns to fault there as
# in the forward (triton_bwd's note), the CUDA context would be lost for the rows after them.
SWEEP = [_C64, {**_C64, "ONE_WALK_LAUNCH": False}, {**_C64, "BF16_BUFFERS": False}, {**_C64, "SPLIT": False}, {**_C64, "NUM_WARPS": 8},
         {**_C64, "BLOCK_V": 128}, {**_C64, "BLOCK_V": 128, "CHUNK_WARPS": 16}, _C32, {**_C32, "ONE_WALK_LAUNCH": False},
         {**_C64, "WALK_INPUTS": True}, {**_C32, "WALK_INPUTS": True}, {**_C32, "WALK_BLOCK_V": 16},
         {**_C64, "WALK_INPUTS": True, "WALK_BLOCK_V": 32}, {**_C64, "WALK_BLOCK_V": 32}, {**_C64, "WALK_BLOCK_V": 32, "ONE_WALK_LAUNCH": False},
         {**_C64, "WALK_BLOCK_V": 16},
         # The walks' loops pipelined (WALK_STAGES), their inputs computed or loaded; 32 columns last, as above.
         {**_C64, "WALK_STAGES": 2}, {**_C64, "WALK_INPUTS": True, "WALK_STAGES": 2}, {**_C64, "WALK_INPUTS": True, "WALK_STAGES": 3},
         {**_C64, "WALK_INPUTS": True, "WALK_BLOCK_V": 32, "WALK_STAGES": 2}, {**_C64, "WALK_INPUTS": True, "WALK_STAGES": 2, "NUM_WARPS": 8}]


def _step(op, x, positions, grad):
    out = op(x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"], positions=positions)
    out.backward(grad)
    grads = {k: t.grad for k, t in x.items()}
    for t in x.values():
        t.grad = None
    return grads


def _fla_train(fla, x, cu, grad) -> None:
    """FLA's forward + backward over x's packed sequences, its gradients dropped after it as `_step` drops ours."""
    _fla_chunk(fla, x, cu).backward(grad)
    for t in x.values():
        t.grad = None


def _back_to_back_ms(fn, n: int) -> float:
    """Time of one of n calls of fn issued back to back (warm L2, the host's gaps included), in ms."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def _profile(step, label: str, device) -> None:
    """Print one step's device time by kernel (5 steps under torch.profiler), its time as bench.py takes it and
    back to back, and the host's costliest ops."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(f"== {label}: CUDA time per step, by kernel (5 steps)")
    events = prof.key_averages()
    # Kernels alone: an op (an aten op, or an autograd Function launching Triton kernels) also reports the
    # device time of the kernels it launched, but no kernel spends host time of its own.
    rows = sorted((e for e in events if e.self_device_time_total > 0 and e.self_cpu_time_total == 0), key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in rows) / 5 / 1000
    print(f"   total {total:.3f} ms; the step as bench.py times it (L2 flushed before each) {kernel_ms(step, device):.3f} ms, "
          f"20 steps back to back {_back_to_back_ms(step, 20):.3f} ms a step")
    for e in rows[:14]:
        print(f"   {e.self_device_time_total / 5 / 1000:8.3f} ms  {e.count // 5:4d} calls  {e.key[:110]}")
    print("   host, by self time (a host sync's wait counts in the op that syncs):")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:10]:
        print(f"   {e.self_cpu_time_total / 5 / 1000:8.3f} ms  {e.count // 5:4d} calls  {e.key[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time the step under each of the backward's tiles instead of profiling")
    parser.add_argument("--shapes", default="", help=f"head shapes, comma-separated (default: all, or the first with --sweep; "
                                                     f"known: {', '.join(SHAPES)})")
    parser.add_argument("--configs", default="", help=f"with --sweep: the rows of SWEEP to run, comma-separated indices (default: all "
                                                      f"{len(SWEEP)}; 0 is the code's tiles, which the others' gradients are compared with)")
    parser.add_argument("--fla", action="store_true", help="profile flash-linear-attention's step by kernel too, after each of ours "
                                                               "(its gated backward's Triton guard lifted, as bench.py gdn does)")
    args = parser.parse_args()
    names = [name for name in args.shapes.split(",") if name] or list(SHAPES)[: 1 if args.sweep else None]
    if unknown := [name for name in names if name not in SHAPES]:
        parser.error(f"--shapes: unknown shape(s) {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    try:
        configs = [SWEEP[int(i)] for i in args.configs.split(",")] if args.configs else SWEEP
    except (ValueError, IndexError):
        parser.error(f"--configs: comma-separated indices below {len(SWEEP)}, got {args.configs!r}")
    device = torch.device("cuda")
    op, _, _ = _contract_op(GPU["contract"])
    generator = torch.Generator(device=device).manual_seed(0)
    default = {name: getattr(triton_bwd, name) for name in SWEEP[0]}
    fla = None
    if args.fla and not args.sweep:
        fla, why = _fla()
        if fla is None:
            parser.error(f"--fla: flash-linear-attention does not import here ({why})")
        _lift_fla_backward_guard()
    for shape_name, shape in ((name, SHAPES[name]) for name in names):
        for seqs, seq_len in GPU["training"]:
            x = {k: t.requires_grad_() for k, t in _inputs(shape, seqs * seq_len, device, generator).items()}
            positions = torch.arange(seq_len, device=device).repeat(seqs)
            grad = torch.randn(seqs * seq_len, shape[1], shape[3], device=device, generator=generator).to(torch.bfloat16)
            if args.sweep:
                want = None
                print(f"== {shape_name} training {seqs} x {seq_len}: forward + backward (ms), gradients vs the first "
                      f"configuration's", flush=True)
                for config in configs:
                    for name, value in config.items():
                        setattr(triton_bwd, name, value)
                    try:
                        got = _step(op, x, positions, grad)
                        want = want or got
                        rel = max(float((got[k].float() - want[k].float()).norm() / want[k].float().norm()) for k in want)
                        ms = kernel_ms(lambda: _step(op, x, positions, grad), device)
                        print(f"   {config}  {ms:.3f} ms  max relative difference of a gradient {rel:.1e}", flush=True)
                    except Exception as error:  # noqa: BLE001  (a tile that does not compile is a row, not the end)
                        print(f"   {config}  failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True)
                for name, value in default.items():
                    setattr(triton_bwd, name, value)
                continue
            _profile(lambda: _step(op, x, positions, grad), f"{shape_name} training {seqs} x {seq_len}", device)
            if fla is not None:
                cu = torch.arange(0, seqs * seq_len + 1, seq_len, device=device, dtype=torch.int32)
                _profile(lambda: _fla_train(fla, x, cu, grad), f"{shape_name} training {seqs} x {seq_len}, FLA", device)
            for name in dir(triton_bwd):
                for kernel in getattr(getattr(triton_bwd, name), "launches", {}).values():
                    print(f"   {name}: {kernel.n_regs} registers, {kernel.n_spills} spilled, {kernel.metadata.shared} B shared")


if __name__ == "__main__":
    main()
