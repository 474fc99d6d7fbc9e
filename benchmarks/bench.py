"""Side-by-side GPU benchmarks: each figure is a ratio measured in one run on one device.

    ISOEXEC_COMMIT=<sha> PYTHONPATH=src python3 benchmarks/bench.py [gemm] [engine] [trainer] --json results.json

gemm:    invariant GEMM impls vs cuBLAS (F.linear) in TFLOP/s, Qwen3-8B layer shapes, M in 1..4096;
engine:  tokens/s of the IsoExec engine under a contract vs under native, same model and workload;
trainer: forward+backward step time under a contract vs native.
Timing: CUDA events via triton.testing.do_bench (median), inputs random (never zeros).
"""

import argparse
import json
import os
import platform
import subprocess
import time

import torch

QWEN3_8B = {  # (N, K) of the projections of one Qwen3-8B layer
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (24576, 4096),
    "down_proj": (4096, 12288),
}
M_VALUES = (1, 16, 64, 256, 1024, 4096)


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")  # ms


def bench_gemm(impls: dict) -> list[dict]:
    import torch.nn.functional as F

    rows = []
    for name, (n, k) in QWEN3_8B.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        for m in M_VALUES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            flops = 2 * m * n * k
            row = {"layer": name, "M": m, "N": n, "K": k, "cublas_ms": _bench(lambda: F.linear(x, w))}
            for impl, op in impls.items():
                row[f"{impl}_ms"] = _bench(lambda: op(x, w))
            for key in [k_ for k_ in row if k_.endswith("_ms")]:
                row[key.replace("_ms", "_tflops")] = flops / row[key] / 1e9
            rows.append(row)
            print(f"{name:<13} M={m:<5} " + "  ".join(f"{k_}={v:.1f}" for k_, v in row.items() if k_.endswith("tflops")), flush=True)
    return rows


def _engine_run(contract_name: str, spec, requests: int, new_tokens: int):
    from isoexec.contract import load_preset
    from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
    from isoexec.model import fit_contract, init_random

    model = init_random(spec, seed=0).cuda()
    contract = fit_contract(load_preset(contract_name), spec)
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, num_pages=requests * 8 + 8, max_num_seqs=requests), device="cuda")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(spec.vocab_size, (32,), generator=g).tolist() for _ in range(requests)]
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=1)
    engine.generate(prompts[:2], params, progress=False)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.generate(prompts, params, progress=False)
    torch.cuda.synchronize()
    return requests * new_tokens / (time.perf_counter() - start)


def bench_engine(contracts: list[str]) -> list[dict]:
    from isoexec.model import PRESETS

    rows = []
    for batch in (1, 16):
        row = {"model": "tiny-dense", "batch": batch, "new_tokens": 16}
        for name in contracts:
            row[f"{name}_tokens_per_s"] = _engine_run(name, PRESETS["tiny-dense"], batch, 16)
        rows.append(row)
        print(row, flush=True)
    return rows


def bench_trainer(contracts: list[str]) -> list[dict]:
    from isoexec.contract import load_preset
    from isoexec.model import PRESETS, fit_contract, init_random
    from isoexec.trainer import sequence_logprobs

    spec = PRESETS["tiny-dense"]
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(spec.vocab_size, (64,), generator=g).tolist() for _ in range(16)]
    row = {"model": "tiny-dense", "sequences": 16, "tokens": 16 * 64}
    for name in contracts:
        model = init_random(spec, seed=0).cuda()
        contract = fit_contract(load_preset(name), spec)

        def step():
            rows = sequence_logprobs(model, contract, seqs, case="trainer_fwd", device="cuda")
            torch.stack([r.sum() for r in rows]).sum().backward()

        row[f"{name}_ms"] = _bench(step)
    print(row, flush=True)
    return [row]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", default=["gemm", "engine", "trainer"], choices=["gemm", "engine", "trainer"])
    parser.add_argument("--contracts", default="tiny-dense,native", help="contracts to compare (engine, trainer)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    contracts = args.contracts.split(",")
    # The device machine gets the working tree without .git: pass ISOEXEC_COMMIT there.
    commit = os.environ.get("ISOEXEC_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(), "commit": commit}
    if "gemm" in args.what:
        impls = {}
        try:
            from isoexec.ops.linear import triton as linear_triton

            impls["triton"] = linear_triton.bench_op()
        except (ImportError, AttributeError) as error:
            print(f"linear.triton unavailable: {error}")
        results["gemm"] = bench_gemm(impls)
    if "engine" in args.what:
        results["engine"] = bench_engine(contracts)
    if "trainer" in args.what:
        results["trainer"] = bench_trainer(contracts)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
