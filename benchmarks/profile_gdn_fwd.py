"""Where gdn.core.triton's forward spends its GPU time, in one launch and in two: the kernels of a trainer call
under torch.profiler, per shape and size, with the walk's time per chunk of a run (the serial chain the two
launches shorten) and each kernel's registers and spills as compiled. bench.py gdn and gdn_bits.py time the
call; this splits it.

    cd benchmarks && PYTHONPATH=../src python3 profile_gdn_fwd.py [--sizes 8x2048,2x4096,1x2048]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from gdn import GPU, SHAPES, _contract_op, _inputs
from isoexec.ops.gdn import triton as gdn_triton
from isoexec.ops.gdn import triton_two_launch as gdn_two_launch
from timing import kernel_ms

# (TWO_LAUNCH_MIN_RUN, TWO_LAUNCH_MAX_FILL): the one launch always, the two always.
PATHS = {"one launch": (None, None), "two launches": (1, None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8x2048,2x4096,1x2048", help="sequences x tokens, comma-separated")
    args = parser.parse_args()
    device = torch.device("cuda")
    op, entry, _ = _contract_op(GPU["contract"])
    chunk = dict(entry.constants)["chunk_size"]
    generator = torch.Generator(device=device).manual_seed(0)
    default = gdn_triton.TWO_LAUNCH_MIN_RUN, gdn_triton.TWO_LAUNCH_MAX_FILL
    for shape_name, shape in SHAPES.items():
        for size in args.sizes.split(","):
            seqs, seq_len = map(int, size.split("x"))
            x = _inputs(shape, seqs * seq_len, device, generator)
            positions = torch.arange(seq_len, device=device).repeat(seqs)

            def call(fresh=False):
                # fresh: a new positions tensor, so the runs are read and their tables built again (gdn/runs.py keeps
                # them for the same unchanged tensor: a model's first GDN layer pays that, the others do not).
                return op(x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"], positions=positions.clone() if fresh else positions)

            for path, setting in PATHS.items():
                gdn_triton.TWO_LAUNCH_MIN_RUN, gdn_triton.TWO_LAUNCH_MAX_FILL = setting
                for _ in range(3):
                    call()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        call()
                    torch.cuda.synchronize()
                rows = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0 and e.self_cpu_time_total == 0),
                              key=lambda e: -e.self_device_time_total)
                total = sum(e.self_device_time_total for e in rows) / 5 / 1000
                print(f"== {shape_name} {seqs} x {seq_len}, {path}: kernels {total:.3f} ms a call, the call as bench.py "
                      f"times it {kernel_ms(call, device):.3f} ms, with new positions {kernel_ms(lambda: call(True), device):.3f} ms",
                      flush=True)
                for e in rows[:6]:
                    ms = e.self_device_time_total / 5 / 1000
                    per_chunk = f"  {1000 * ms / -(-seq_len // chunk):6.2f} us a chunk of a run" if "walk" in e.key or "fwd_kernel" in e.key else ""
                    print(f"   {ms:8.3f} ms  {e.count // 5:3d} calls  {e.key[:60]}{per_chunk}")
    gdn_triton.TWO_LAUNCH_MIN_RUN, gdn_triton.TWO_LAUNCH_MAX_FILL = default
    for module, name in ((gdn_triton, "gdn_fwd_kernel"), (gdn_two_launch, "gdn_chunks_kernel"), (gdn_two_launch, "gdn_walk_kernel")):
        for kernel in getattr(getattr(module, name), "launches", {}).values():
            print(f"   {name}: {kernel.n_regs} registers, {kernel.n_spills} spilled, {kernel.metadata.shared} B shared, "
                  f"{kernel.metadata.num_warps} warps")


if __name__ == "__main__":
    main()
