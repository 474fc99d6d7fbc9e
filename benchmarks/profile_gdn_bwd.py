"""Where gdn.core.triton's forward + backward spends its GPU time: the kernels of one training step under
torch.profiler, per shape, summed by kernel name (bench.py gdn times the whole step; this splits it).

    cd benchmarks && PYTHONPATH=../src python3 profile_gdn_bwd.py
"""

import torch
from torch.profiler import ProfilerActivity, profile

from gdn import GPU, SHAPES, _contract_op, _inputs


def main() -> None:
    device = torch.device("cuda")
    op, _, _ = _contract_op(GPU["contract"])
    generator = torch.Generator(device=device).manual_seed(0)
    for shape_name, shape in SHAPES.items():
        for seqs, seq_len in GPU["training"]:
            x = {k: t.requires_grad_() for k, t in _inputs(shape, seqs * seq_len, device, generator).items()}
            positions = torch.arange(seq_len, device=device).repeat(seqs)

            def step():
                out = op(x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"], positions=positions)
                out.backward(torch.ones_like(out))
                for t in x.values():
                    t.grad = None

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            print(f"== {shape_name} training {seqs} x {seq_len}: CUDA time per step, by kernel (5 steps)")
            rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
            total = sum(e.device_time_total for e in rows) / 5 / 1000
            print(f"   total {total:.3f} ms")
            for e in rows[:12]:
                print(f"   {e.device_time_total / 5 / 1000:8.3f} ms  {e.count // 5:4d} calls  {e.key[:110]}")


if __name__ == "__main__":
    main()
