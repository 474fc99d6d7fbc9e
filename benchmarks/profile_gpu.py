"""Where a decode step's and a training step's GPU time goes, and how tile constants move kernel speed.

    PYTHONPATH=src:benchmarks python3 benchmarks/profile_gpu.py [SECTION ...] [--model qwen3-0.6b-random] [--contract tiny-dense-triton]

decode:    wall time per engine step and per phase of it, async scheduling on and off; cProfile of
           `LLMEngine.generate` (host time per function); then the pieces of one decode step timed alone
           on the device: graph replay, sampling.
attention: attention.triton in prefill, training (packed) and decode forms over a grid of block_m /
           num_warps / num_stages, as graph replays beside flash SDPA, each output compared bit for bit
           with the listed constants'.
gemm:      decode-sized linear.triton GEMMs (M = 1 … 64, --model's projection shapes) as CUDA-graph replays: candidate
           tiles with the listed block_k or twice it, timed beside cuBLAS and compared bit for bit with
           the listed tile.
trainer:   one trainer_fwd forward + backward (bench.py's trainer workload, --seqs x --seq-len tokens) under
           the contract, contracts/fast-baseline.toml and native, each under torch.profiler: wall time,
           GPU busy time, and GPU time per kernel name; then a host profile (cProfile) of each.
decode-kernels: one decode step's graph replay and kernels under the contract and under
           contracts/fast-baseline.toml, batch 1 and 64.
prefill:   bench.py engine's batch-64 work up to its first token (64 prompts of 128 tokens, one draw each) under the
           contract and contracts/fast-baseline.toml: wall time over repeats, engine steps and prefill chunks, the
           host's share (cProfile), and GPU time per kernel under torch.profiler. Where bench.py's batch-64 ratio
           and its decode steps disagree, this is the rest of the generate.
decode-launch: every projection shape of --model at decode sizes (M = 1, 16, 64) under its Hopper decode
           tile, launched persistently (as linear.triton does where K allows TMA) and one program per
           tile, and the row-parallel fold of o_proj and down_proj, as graph replays beside cuBLAS, with
           the weight bandwidth each reaches and whether the two launches agree bit for bit.
moe:       one MoE layer's forward + backward at Qwen3-30B-A3B's shape (bench.py moe's workload, 4096 and
           16384 tokens) under the contract's Triton impls and the torch._grouped_mm baseline, under
           torch.profiler: GPU time per kernel name.
moe-tiles: the MoE layer's pieces alone at both of bench.py moe's shapes (router, experts, combine;
           CUDA-graph replays at 1, 16, 64 tokens, eager at 4096), beside native's router and
           moe.experts.grouped_mm, then candidate router and experts tiles at each shape timed the same
           way, each output compared bit for bit with the listed tile's.
mla-tiles: mla.triton at GLM-4.7-Flash's MLA shape per phase (training 8 x 2048 packed, prefill 2048 after
           8192 cached, decode batch 1 / 16 / 64 after 2048 as graph replays) over a grid of attention
           tiles (block_m, block_n, num_warps, num_stages, value_split), the attention launch alone and
           the whole op (with its two per-head GEMMs), each output compared bit for bit with the listed tile's.
gdn-tiles: gdn.core.triton at Qwen3.5's GDN shapes over a grid of constants (chunk_size, block_v, num_warps,
           dot_precision): per config, one sequence's rows in every form (packed alone and after others,
           prefill chunks of 37 over a NaN-poisoned cache, decode token by token) compared bit for bit with
           the packed rows, then training 8 x 2048 (forward, and forward + backward), prefill 2048 after 2048
           cached, decode batch 1 / 16 / 64 / 256 at chunk offsets 0 and C - 1 (graph replays), beside
           flash-linear-attention (whose backward refuses Triton 3.6 on Hopper).
launch:    host time per call (no profiler: perf_counter over many calls of a tiny problem, so the GPU
           keeps up) of the trainer's ops under the contract and native, and of the layers beneath
           linear.triton: tensor descriptors, Triton's launch, our wrapper, autograd.
The tile sweeps (attention, gemm, decode-launch, moe-tiles, mla-tiles, gdn-tiles) are in sweep_tiles.py; this
script runs them by name. An experiment script (docs/experiments.md), not a benchmark of record.
"""

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
from pathlib import Path
import time

import torch

from isoexec.contract import fit_contract, load, load_preset
from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
from isoexec.model import PRESETS, init_random
from sweep_tiles import decode_launch, profile_gdn_tiles, profile_mla_tiles, profile_moe_tiles, sweep_attention, sweep_decode_gemm
from timing import kernel_ms

FAST_BASELINE = str(Path(__file__).resolve().parent / "contracts" / "fast-baseline.toml")


def profile_decode(model_name: str, contract_name: str, batch: int, new_tokens: int = 64) -> None:
    model = init_random(PRESETS[model_name], seed=0).cuda()
    contract = fit_contract(load_preset(contract_name), model.spec, device="cuda")
    config = EngineConfig.from_contract(contract, num_pages=batch * 16 + 8, max_num_seqs=max(batch, 2), cuda_graphs=True)
    engine = LLMEngine(model, contract, config, device="cuda")
    prompts = [torch.randint(model.spec.vocab_size, (128,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(batch)]
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
    engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True), progress=False)
    _phase_times(engine, prompts, params)
    engine.config = dataclasses.replace(engine.config, async_scheduling=False)
    _phase_times(engine, prompts, params)
    engine.config = dataclasses.replace(engine.config, async_scheduling=True)
    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    engine.generate(prompts, params, progress=False)
    torch.cuda.synchronize()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    print(f"== cProfile, {model_name} under {contract_name}, batch {batch}, {new_tokens} new tokens (tottime)")
    stats.sort_stats("tottime").print_stats(22)
    print("\n".join(out.getvalue().splitlines()[:60]))

    runner = engine.runner
    graphs = runner.decode_graphs
    b = batch
    ids = torch.zeros(b, dtype=torch.int64, device="cuda")
    pos = torch.full((b,), 100, dtype=torch.int64, device="cuda")
    slots = torch.arange(b * 128, device="cuda").reshape(b, 128)
    write = slots[:, 100].clone()
    replay = kernel_ms(lambda: graphs.run(ids, pos, write, slots), torch.device("cuda"))
    rows, _ = graphs.run(ids, pos, write, slots)
    ops = runner.binding.ops["engine_decode"]
    f32 = torch.ones(b, device="cuda")
    i64 = torch.zeros(b, dtype=torch.int64, device="cuda")
    # No row filters, as in the engine's temperature-only draws: nothing is read back (a readback would time the host).
    sample = kernel_ms(lambda: ops["sample"](rows, f32, i64, f32, i64, i64, may_filter=False), torch.device("cuda"))
    print(f"== device time, batch {b}: graph replay (forward + log-probs) {replay:.3f} ms, sampling {sample:.3f} ms (no filtering row)")
    kernel_table(graphs, b)


def _phase_times(engine, prompts, params) -> None:
    """Wall time per engine step and per phase of it over one generate, no profiler: each phase's calls are
    timed with perf_counter as they run (the host's syncs, where the code makes them, are inside the phase
    that makes them)."""
    from isoexec.engine.scheduler import Scheduler

    spent: dict[str, list[float]] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent.setdefault(name, []).append(time.perf_counter() - start)
        return wrapper

    runner, graphs = engine.runner, engine.runner.decode_graphs
    saved = (Scheduler.schedule, Scheduler.resolve, runner.run, graphs.run, runner.ops["engine_decode"]["sample"])
    Scheduler.schedule, Scheduler.resolve = timed("schedule", saved[0]), timed("resolve", saved[1])
    runner.run, graphs.run = timed("run", saved[2]), timed("graphs.run", saved[3])
    runner.ops["engine_decode"]["sample"] = timed("sample", saved[4])
    engine.step, engine._resolve = timed("step", engine.step), timed("wait + resolve", engine._resolve)
    try:
        torch.cuda.synchronize()
        engine.generate(prompts, params, progress=False)
        torch.cuda.synchronize()
    finally:
        Scheduler.schedule, Scheduler.resolve = saved[:2]
        del runner.run, graphs.run, engine.step, engine._resolve
        runner.ops["engine_decode"]["sample"] = saved[4]
    decode_steps = sorted(spent["step"])[: len(spent["graphs.run"])]  # the prefill steps are the slowest
    median = lambda xs: sorted(xs)[len(xs) // 2] * 1e3  # noqa: E731
    print(f"== host phases, batch {len(prompts)}: median ms over {len(spent['step'])} steps: step {median(spent['step']):.3f} "
          f"(decode-only steps {median(decode_steps):.3f}), schedule {median(spent['schedule']):.3f}, run {median(spent['run']):.3f} "
          f"(of which graphs.run {median(spent['graphs.run']):.3f}, sample {median(spent['sample']):.3f}), "
          f"the draws' wait and processing {median(spent['wait + resolve']):.3f} (processing alone {median(spent['resolve']):.3f}); "
          f"async scheduling {'on' if engine.config.async_scheduling else 'off'}, {engine.stats['overlapped_steps']} steps overlapped")


def decode_kernels(model_name: str, contracts: list[str], batches=(1, 64)) -> None:
    """Per contract (preset or file) and batch: one decode step's graph replay, and the eager decode
    forward's kernels under torch.profiler."""
    model = init_random(PRESETS[model_name], seed=0).cuda()
    for spec in contracts:
        contract = fit_contract(load(spec), model.spec, device="cuda")
        batch_max = max(batches)
        config = EngineConfig.from_contract(contract, num_pages=batch_max * 16 + 8, max_num_seqs=max(batch_max, 2), cuda_graphs=True)
        engine = LLMEngine(model, contract, config, device="cuda")
        engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True), progress=False)
        graphs = engine.runner.decode_graphs
        for b in batches:
            ids = torch.zeros(b, dtype=torch.int64, device="cuda")
            pos = torch.full((b,), 100, dtype=torch.int64, device="cuda")
            slots = torch.arange(b * 128, device="cuda").reshape(b, 128)
            write = slots[:, 100].clone()
            replay = kernel_ms(lambda graphs=graphs: graphs.run(ids, pos, write, slots), torch.device("cuda"))
            print(f"== {contract.name}, batch {b}: decode graph replay (forward + log-probs) {replay:.3f} ms")
            kernel_table(graphs, b)
        del engine, graphs
        torch.cuda.empty_cache()


def profile_prefill(model_name: str, contracts: list[str], batch: int = 64, prompt_len: int = 128, reps: int = 5) -> None:
    """Per contract: `generate` of bench.py engine's batch-64 prompts with one new token each, on an engine configured as
    bench.py's (its decode graphs captured, async scheduling on)."""
    model = init_random(PRESETS[model_name], seed=0).cuda()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(model.spec.vocab_size, (prompt_len,), generator=generator).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=1.0, max_tokens=1, ignore_eos=True)
    for spec in contracts:
        contract = fit_contract(load(spec), model.spec, device="cuda")
        pages = -(-(prompt_len + 128) // contract.deployment.engine.kv_page_size) + 1
        config = EngineConfig.from_contract(contract, num_pages=batch * pages + 8, max_num_seqs=batch, max_model_len=prompt_len + 128,
                                            cuda_graphs=True)
        engine = LLMEngine(model, contract, config, device="cuda")

        def run(engine=engine):
            engine.generate(prompts, params, progress=False)

        run()
        before = dict(engine.stats)
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        per_run = {key: (engine.stats[key] - before[key]) / reps for key in ("steps", "prefill_chunks", "prefill_tokens")}
        print(f"== {contract.name}, {batch} x {prompt_len} prompt tokens and one draw each: median {sorted(times)[reps // 2]:.2f} ms "
              f"(min {min(times):.2f}) over {reps}; a run's engine steps {per_run['steps']:.0f}, prefill chunks "
              f"{per_run['prefill_chunks']:.0f}, prefill tokens {per_run['prefill_tokens']:.0f}", flush=True)
        host_profile(run, f"{contract.name}, prefill", rows=16)
        profiled_kernels(run, f"{contract.name}, prefill")
        del engine
        torch.cuda.empty_cache()


def profiled_kernels(fn, title: str, rows: int = 18) -> None:
    """fn() run once under torch.profiler (after one warm-up call): wall time, and GPU time and launches per kernel name."""
    import time

    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    totals = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            time_us, count = totals.get(event.name, (0.0, 0))
            totals[event.name] = (time_us + event.device_time, count + 1)
    total = sum(t for t, _ in totals.values())
    print(f"== {title}: {sum(c for _, c in totals.values())} launches, {total / 1e3:.3f} ms of GPU time, "
          f"{wall * 1e3:.3f} ms wall (profiled)")
    for name, (time_us, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:rows]:
        print(f"  {time_us / 1e3:8.3f} ms  {count:5d}x  {name[:110]}")


def kernel_table(graphs, batch: int) -> None:
    """The padded decode forward run eagerly under torch.profiler, without autograd as the engine runs it
    (with autograd, ops that take another path for it, such as the fused q/k norm and rotary launch, would
    be counted as the separate kernels)."""
    bucket = next(x for x in graphs.buckets if x >= batch)

    def forward():
        with torch.no_grad():
            graphs._forward(bucket)

    profiled_kernels(forward, f"kernels of one eager decode forward, batch {batch}")


def profile_trainer(model_name: str, contracts: list[str], num_seqs: int = 8, seq_len: int = 512) -> None:
    """bench.py's trainer workload: trainer_fwd log-probs of num_seqs x seq_len tokens, their sum, backward."""
    from isoexec.trainer import sequence_logprobs

    model = init_random(PRESETS[model_name], seed=0).cuda()
    generator = torch.Generator().manual_seed(0)
    seqs = [torch.randint(model.spec.vocab_size, (seq_len,), generator=generator).tolist() for _ in range(num_seqs)]
    for name in contracts:
        contract = fit_contract(load(name), model.spec, device="cuda")
        name = Path(name).stem

        def step():
            rows = sequence_logprobs(model, contract, seqs, case="trainer_fwd", device="cuda")
            torch.stack([r.sum() for r in rows]).sum().backward()
            model.zero_grad(set_to_none=True)

        forward = lambda: sequence_logprobs(model, contract, seqs, case="trainer_score", device="cuda")  # noqa: E731
        profiled_kernels(step, f"{model_name} trainer_fwd forward + backward, {num_seqs} x {seq_len} tokens, {name}", rows=24)
        profiled_kernels(forward, f"{model_name} trainer_score forward alone, {name}", rows=12)
        host_profile(step, f"{model_name} trainer_fwd forward + backward, {name}")
        torch.cuda.empty_cache()


def host_profile(fn, title: str, rows: int = 28) -> None:
    """Where the host's time goes in one call of fn (after a warm-up): cProfile, by own time and by
    cumulative time. cProfile inflates Python-heavy paths (Triton's launch) more than C++ ones."""
    fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    torch.cuda.synchronize()
    profiler.disable()
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(rows)
        print(f"== host time (cProfile, {order}), {title}")
        print("\n".join(line[:170] for line in out.getvalue().splitlines()[:rows + 12]))


def host_us(fn, calls: int = 300) -> float:
    """Host microseconds per call of fn, which must enqueue less GPU work than its host cost."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def profile_launch(model_name: str, contract_name: str) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    from isoexec.runtime.binding import bind
    from isoexec.ops.linear import persistent_triton
    from isoexec.ops.linear import triton as linear_triton

    spec = PRESETS[model_name]
    attention = spec.attention[0]
    n, k, m = attention.num_heads * attention.head_dim, spec.hidden_size, 16
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    wg = w.clone().requires_grad_()
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    tiles = {key: linear_triton.hopper_constants(n, k)[key] for key in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
    bm, bn, bk = tiles["block_m"], tiles["block_n"], tiles["block_k"]
    programs = min(torch.cuda.get_device_properties(0).multi_processor_count, -(-m // bm) * -(-n // bn))
    xd, wd = TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk])
    kernel = persistent_triton.linear_persistent_kernel
    consts = dict(NK=-(-k // bk), G=1, HAS_BIAS=False, DOT_IN_FP32=False, INTERPRETED=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  GROUP=persistent_triton.GROUP_M, num_warps=tiles["num_warps"], num_stages=tiles["num_stages"])
    raw = lambda: kernel[(programs,)](xd, wd, x, y, m, n, programs, y.stride(0), y.stride(1), **consts)  # noqa: E731
    compiled = raw()
    print(f"== host time per call (us), {model_name} q_proj shape N={n} K={k}, M={m}")
    rows = [("torch x + x", lambda: x + x), ("torch F.linear", lambda: torch.nn.functional.linear(x, w)),
            ("TensorDescriptor.from_tensor x2", lambda: (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]))),
            ("persistent kernel[grid](...), descriptors built", raw)]
    try:
        runner = compiled[(programs, 1, 1)]
        args = (xd, wd, x, y, m, n, programs, y.stride(0), y.stride(1), *[v for key, v in consts.items() if key not in ("num_warps", "num_stages")])
        runner(*args)
        rows.append(("CompiledKernel[grid](...) runner", lambda: runner(*args)))
    except Exception as error:  # noqa: BLE001  (an internal API: report, go on)
        print(f"CompiledKernel runner: {type(error).__name__}: {str(error)[:120]}")
    rows += [("y = x.new_empty(M, N)", lambda: x.new_empty((m, n))),
             ("persistent_triton._tma_ready x2", lambda: (persistent_triton._tma_ready(x), persistent_triton._tma_ready(w))),
             ("linear_triton.launch (grid kernel)", lambda: linear_triton.launch(x, w, None, y[None], **tiles)),
             ("persistent_triton.linear_fwd_persistent", lambda: persistent_triton.linear_fwd_persistent(x, w, None, y, **tiles)),
             ("linear_triton.linear_fwd", lambda: linear_triton.linear_fwd(x, w, None, torch.bfloat16, **tiles))]
    for name in (contract_name, "native"):
        contract = fit_contract(load_preset(name), spec, device="cuda")
        ops = bind(contract, spec, "trainer_fwd").ops["trainer_fwd"]
        h = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        norm_w = torch.ones(k, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(m, attention.num_heads, attention.head_dim, device="cuda", dtype=torch.bfloat16)
        positions = torch.arange(m, device="cuda")
        o_w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) * n**-0.5
        o_x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            rows += [(f"{name}: q_proj, no grad", lambda ops=ops: ops["q_proj"](x, w, None)),
                     (f"{name}: o_proj, no grad", lambda ops=ops: ops["o_proj"](o_x, o_w, None)),
                     (f"{name}: input_layernorm, no grad", lambda ops=ops: ops["input_layernorm"](h, h, norm_w, 1e-6)),
                     (f"{name}: rotary_emb, no grad", lambda ops=ops: ops["rotary_emb"](q, positions, attention.rope_theta, spec.max_position_embeddings)),
                     (f"{name}: silu_mul, no grad", lambda ops=ops: ops["silu_mul"](h, h))]
        rows.append((f"{name}: q_proj, autograd (weight requires grad)", lambda ops=ops: ops["q_proj"](x, wg, None)))
    for label, fn in rows:
        grad = torch.enable_grad() if "autograd" in label else torch.no_grad()
        with grad:
            print(f"{label:<52} {host_us(fn):8.1f}", flush=True)


def profile_moe(tokens=(4096, 16384)) -> None:
    from moe import QWEN3_30B_A3B, Layer, _params, contract_layer, grouped_mm_layer

    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    p = _params(QWEN3_30B_A3B, device, generator)
    leaves = [t.clone().requires_grad_() for t in (p.gate, p.gate_up, p.down)]
    q = Layer(*leaves, p.top_k)
    for count in tokens:
        x = torch.randn(count, QWEN3_30B_A3B["hidden"], generator=generator, device=device).bfloat16().requires_grad_()
        g = torch.randn_like(x)
        for name, layer in (("contract", contract_layer(QWEN3_30B_A3B)), ("grouped_mm", grouped_mm_layer)):
            def step():
                layer(x, q).backward(g)
                for t in (x, *leaves):
                    t.grad = None
            profiled_kernels(step, f"moe {name} fwd+bwd, {count} tokens", rows=14)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", help="decode, decode-kernels, prefill, attention, gemm, trainer, launch, moe, moe-tiles (default: decode "
                                                "and attention)")
    parser.add_argument("--model", default="qwen3-0.6b-random")
    parser.add_argument("--contract", default="tiny-dense-triton")
    parser.add_argument("--seqs", type=int, default=8, help="trainer: sequences per step")
    parser.add_argument("--seq-len", type=int, default=512, help="trainer: tokens per sequence")
    parser.add_argument("--gdn-config", action="append", default=[], metavar="C,BV,WARPS,PRECISION",
                        help="gdn-tiles: one config to time (repeatable; default: the built-in grid)")
    parser.add_argument("--gdn-no-fla", action="store_true", help="gdn-tiles: leave flash-linear-attention's rows out")
    parser.add_argument("--gdn-shape", action="append", default=[], help="gdn-tiles: one of bench gdn's SHAPES (repeatable; default: all)")
    args = parser.parse_args()
    sections = {"decode", "decode-kernels", "prefill", "decode-launch", "attention", "gemm", "trainer", "launch", "moe", "moe-tiles", "mla-tiles", "gdn-tiles"}
    args.what = args.what or ["decode", "attention"]
    if set(args.what) - sections:
        parser.error(f"unknown section(s) {sorted(set(args.what) - sections)}: choose from {', '.join(sorted(sections))}")
    print(" ".join(sys.argv), torch.cuda.get_device_name())
    if "decode" in args.what:
        for batch in (1, 64):
            profile_decode(args.model, args.contract, batch)
    if "attention" in args.what:
        sweep_attention()
    if "gemm" in args.what:
        sweep_decode_gemm(args.model)
    if "decode-kernels" in args.what:
        decode_kernels(args.model, [args.contract, FAST_BASELINE])
    if "prefill" in args.what:
        profile_prefill(args.model, [args.contract, FAST_BASELINE])
    if "decode-launch" in args.what:
        decode_launch(args.model)
    if "launch" in args.what:
        profile_launch(args.model, args.contract)
    if "moe" in args.what:
        profile_moe()
    if "moe-tiles" in args.what:
        profile_moe_tiles()
    if "mla-tiles" in args.what:
        profile_mla_tiles()
    if "gdn-tiles" in args.what:
        configs = [dict(zip(("chunk_size", "block_v", "num_warps"), map(int, c.split(",")[:3])), dot_precision=c.split(",")[3])
                   for c in args.gdn_config]
        profile_gdn_tiles(configs=configs or None, with_fla=not args.gdn_no_fla, shapes=args.gdn_shape)
    if "trainer" in args.what:
        profile_trainer(args.model, [args.contract, FAST_BASELINE, "native"], args.seqs, args.seq_len)


if __name__ == "__main__":
    main()
