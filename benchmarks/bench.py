"""Side-by-side benchmarks: each figure is a ratio measured in one run on one device.

    ISOEXEC_COMMIT=<sha> PYTHONPATH=src python3 benchmarks/bench.py [SECTION ...] --json FILE

A run kept in the repository goes to benchmarks/results/<date>_<commit>_<section>.json (`all` for every
section; the index is benchmarks/results/README.md).

gemm:      invariant GEMM impls (linear.triton, launched persistently with TMA loads, and the row-parallel
           Triton GEMM) vs cuBLAS (F.linear) in TFLOP/s, Qwen3-8B layer shapes, M in 1..4096; each call
           timed as a CUDA-graph replay (device time, as decode graphs run) and eagerly (host launch cost
           included, as the trainer runs);
attention: the Triton attention and attention.native vs SDPA (flash), Qwen3-8B heads, prefill of one
           sequence and decode of 1, 8 and 64 sequences (attention.py);
engine:    tokens/s of the IsoExec engine under each contract of --contracts, batch 1 and 64 (engine.py);
hf:        the engine vs Hugging Face `generate` on the same model, weights and prompts (engine.py);
roofline:  the engine's decode step time vs weights + KV bytes / measured copy bandwidth (engine.py);
trainer:   forward + backward of `Trainer.logprobs` (trainer_fwd) under each contract, one micro-batch
           per step, at each of the trainer shapes (sequences x tokens);
moe:       one MoE layer (router + experts + combine) at two MoE layer shapes (Qwen3-30B-A3B's, and 256
           experts of 512) under the Triton MoE impls vs native and a torch._grouped_mm baseline, decode
           batches and training shapes (moe.py);
mla:       multi-head latent attention (mla_attn) under the contract vs native, training, prefill and decode,
           at GLM-4.7-Flash's shapes (mla.py; the contract's `mla` entry, tiny-mla-triton by default).
gdn:       Gated DeltaNet's core (gdn_core) under the contract vs flash-linear-attention, training, prefill and
           decode, at two GDN shapes (gdn.py; the contract's `gdn.core` entry, tiny-hybrid-triton by default).
rl:        whole synchronous GRPO steps (generate, train, sync) under each contract of --contracts, on the
           models of --rl-model (default: the Qwen3-0.6B-shaped preset; rl.py): the step time the contract costs.

engine, hf, roofline and trainer run on each model of --model in turn (by default the Qwen3-0.6B- and
Qwen3-8B-shaped random presets); their results are keyed by model: results[section][model].
--contracts takes preset names or contract files; on CUDA the default compares tiny-dense-triton with
two baselines: benchmarks/contracts/fast-baseline.toml (cuBLAS GEMMs and torch log_softmax, the Triton
kernels elsewhere: the fastest non-invariant composition we have) and native.
Ratios are speed ratios: `<a>_vs_<b>` = b's time / a's time (or a's tokens/s / b's), so 0.9 reads
"a runs at 90% of b's speed"; the first contract in --contracts is compared with each of the others.
Timing: kernels by `triton.testing.do_bench` (median, CUDA events); steps and whole generates by
wall clock after a warm-up (timing.py). Inputs are random (never zeros). A section whose optional piece
is missing (the Triton attention, transformers, a contract the model cannot run) says why and goes on.
`--small --device cpu` shrinks every size so all sections run on a CPU in seconds (tests/test_bench.py).
"""

import argparse
import dataclasses
import gc
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from attention import bench_attention
from engine import Engines, bench_engine, bench_hf, bench_roofline
from gdn import SHAPES as GDN_SHAPES
from gdn import SMALL_SHAPES as GDN_SMALL_SHAPES
from gdn import bench_gdn
from mla import bench_mla
from rl import bench_rl
from moe import GPU_SHAPES, TINY, bench_moe
from isoexec.contract import ContractError, fit_contract, load
from isoexec.engine import EngineConfig
from isoexec.model import PRESETS, init_random
from isoexec.trainer import Trainer
from timing import device_name, graphed_ms, kernel_ms, wall_ms
import variants

SECTIONS = ("gemm", "attention", "engine", "hf", "roofline", "trainer", "moe", "mla", "gdn", "rl")
MODEL_SECTIONS = ("engine", "hf", "roofline", "trainer")
QWEN3_8B = {  # (N, K) of the projections of one Qwen3-8B layer
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (24576, 4096),
    "down_proj": (4096, 12288),
}
ROW_PARALLEL = ("o_proj", "down_proj")  # the projections whose K is split across TP ranks
HERE = Path(__file__).resolve().parent
GPU_CONTRACTS = ("tiny-dense-triton", str(HERE / "contracts" / "fast-baseline.toml"), "native")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    models: tuple[str, ...]
    """Model presets of the engine, hf, roofline and trainer sections, each in turn (isoexec.model.PRESETS)."""
    gemm_shapes: dict
    m_values: tuple[int, ...]
    attention_heads: tuple[int, int, int]
    """(query heads, KV heads, head dim)."""
    prefill_lengths: tuple[int, ...]
    decode_batches: tuple[int, ...]
    """Sequences of the attention section's decode calls: batch 1-8 takes the spread decode (`triton_blocks.py`), 64 the
    walk."""
    decode_contexts: tuple[int, ...]
    attention_reference: bool
    """Also time attention.reference (only at tiny sizes: it is a loop of small torch ops)."""
    batches: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    trainer_shapes: tuple[tuple[int, int], ...]
    """(sequences, tokens each) of the trainer steps; each step is one micro-batch of all of them."""
    copy_bytes: int
    rl_models: tuple[str, ...]
    """Model presets of the rl section (its float32 masters and AdamW moments take 12 bytes a parameter beside the
    engine's copy: the 8B preset does not fit one H200)."""
    rl_shape: tuple[int, int, int, int]
    """(prompts a step, completions a prompt, max new tokens, timed steps) of the rl section."""


# Tokens per micro-batch of a trainer step (one backward each, gradients accumulated), where the whole step
# does not fit one: each of Qwen3-8B's 36 layers keeps ~300 KB a token for the backward (measured under native
# on a CPU), so a step of 16k tokens in one micro-batch would hold ~176 GB. Other models run a step as one.
TRAINER_MICRO_BATCH_TOKENS = {"qwen3-8b-random": 4096}

FULL = Sizes(models=("qwen3-0.6b-random", "qwen3-8b-random"), gemm_shapes=QWEN3_8B, m_values=(1, 16, 64, 256, 1024, 4096), attention_heads=(32, 8, 128),
             prefill_lengths=(512, 2048, 8192), decode_batches=(1, 8, 64), decode_contexts=(512, 2048, 8192), attention_reference=False,
             batches=(1, 64), prompt_len=128, new_tokens=128, trainer_shapes=((8, 512), (32, 512), (8, 2048)), copy_bytes=2 << 30,
             rl_models=("qwen3-0.6b-random",), rl_shape=(8, 8, 256, 3))
SMALL = Sizes(models=("tiny-dense",), gemm_shapes={"qkv_proj": (128, 64), "o_proj": (64, 64), "gate_up_proj": (256, 64), "down_proj": (64, 128)},
              m_values=(1, 16, 64), attention_heads=(4, 2, 32), prefill_lengths=(32, 64), decode_batches=(1, 4), decode_contexts=(32, 64),
              attention_reference=True, batches=(1, 4), prompt_len=16, new_tokens=8, trainer_shapes=((4, 32),), copy_bytes=64 << 20,
              rl_models=("tiny-dense",), rl_shape=(2, 2, 4, 1))


def _optional_op(what: str, candidates: tuple[tuple[str, str], ...]):
    """The first `module.attribute()` of candidates that imports, or None (and a line saying so)."""
    for module, attribute in candidates:
        try:
            return getattr(importlib.import_module(module), attribute)()
        except (ImportError, AttributeError):
            continue
    print(f"{what}: unavailable (none of {', '.join(f'{m}.{a}' for m, a in candidates)})")
    return None


def bench_gemm(sizes: Sizes, device: torch.device) -> list[dict]:
    impls, row_parallel = {}, None
    if device.type != "cuda":
        print("linear.triton: skipped (no CUDA device)")
    else:
        impls["triton"] = _optional_op("linear.triton", (("isoexec.ops.linear.triton", "bench_op"),))
        row_parallel = _optional_op("row-parallel Triton GEMM", (
            ("isoexec.ops.linear.triton", "bench_row_parallel_op"),
            ("isoexec.ops.linear.row_parallel_triton", "bench_op"),
            ("isoexec.ops.linear.triton_row_parallel", "bench_op"),
        ))
    impls = {name: op for name, op in impls.items() if op is not None}
    rows = []
    for name, (n, k) in sizes.gemm_shapes.items():
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        ops = {**impls, **({"row_parallel_triton": row_parallel} if row_parallel and name in ROW_PARALLEL else {})}
        for m in sizes.m_values:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            row = {"layer": name, "M": m, "N": n, "K": k, "cublas_ms": graphed_ms(lambda: F.linear(x, w), device),
                   "cublas_eager_ms": kernel_ms(lambda: F.linear(x, w), device)}
            for impl, op in ops.items():
                row[f"{impl}_ms"] = graphed_ms(lambda op=op: op(x, w), device)
                row[f"{impl}_eager_ms"] = kernel_ms(lambda op=op: op(x, w), device)
            for key in [key for key in row if key.endswith("_ms") and not key.endswith("_eager_ms")]:
                row[key.replace("_ms", "_tflops")] = 2 * m * n * k / row[key] / 1e9
                if key != "cublas_ms":
                    row[key.replace("_ms", "_vs_cublas")] = row["cublas_ms"] / row[key]
                    row[key.replace("_ms", "_eager_vs_cublas")] = row["cublas_eager_ms"] / row[key.replace("_ms", "_eager_ms")]
            rows.append(row)
            print(f"gemm {name:<13} M={m:<5} " + "  ".join(f"{key.removesuffix('_tflops')} {v:.1f} TFLOP/s" for key, v in row.items()
                                                   if key.endswith("_tflops")), flush=True)
    return rows


def bench_trainer(model, model_name: str, sizes: Sizes, contracts: dict, device: torch.device, reps: int = 7) -> list[dict]:
    """contracts: label -> Contract, the one under test first. A step this small is host-bound and its
    wall time drifts with the host, so the contracts take turns, rep by rep, and each keeps its median."""
    names = list(contracts)
    rows = []
    for num_seqs, seq_len in sizes.trainer_shapes:
        generator = torch.Generator().manual_seed(0)
        seqs = [torch.randint(model.spec.vocab_size, (seq_len,), generator=generator).tolist() for _ in range(num_seqs)]
        micro_batch = min(TRAINER_MICRO_BATCH_TOKENS.get(model_name, num_seqs * seq_len), num_seqs * seq_len)
        per_micro_batch = max(1, micro_batch // seq_len)
        row = {"model": model_name, "sequences": num_seqs, "tokens": num_seqs * seq_len, "micro_batch_tokens": per_micro_batch * seq_len, "reps": reps}

        def step(trainer):
            for first in range(0, num_seqs, per_micro_batch):
                rows = trainer.logprobs(seqs[first:first + per_micro_batch], case="trainer_fwd", device=device, micro_batch_tokens=micro_batch)
                torch.stack([r.sum() for r in rows]).sum().backward()
            model.zero_grad(set_to_none=True)

        fitted, times = {}, {name: [] for name in names}
        for name, contract in contracts.items():
            try:
                fitted[name] = Trainer(model, fit_contract(contract, model.spec, device=device))  # bound once, as a training loop does
                with variants.kernels(name):
                    step(fitted[name])  # warm-up: compiles
            except (RuntimeError, ValueError) as error:  # out of memory, a contract the model cannot run
                row[f"{name}_error"] = str(error).splitlines()[0]
                print(f"trainer {name}: failed ({row[f'{name}_error']})")
                fitted.pop(name, None)
                model.zero_grad(set_to_none=True)
        for _ in range(reps):
            for name, trainer in fitted.items():
                with variants.kernels(name):
                    times[name].append(wall_ms(lambda: step(trainer), device, reps=1, warmup=False))
        for name in fitted:
            row[f"{name}_ms"] = statistics.median(times[name])
            row[f"{name}_min_ms"] = min(times[name])  # a host-bound step's least-disturbed rep
            row[f"{name}_all_ms"] = times[name]
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for baseline in names[1:]:
            if f"{names[0]}_ms" in row and f"{baseline}_ms" in row:
                row[f"{names[0]}_vs_{baseline}"] = row[f"{baseline}_ms"] / row[f"{names[0]}_ms"]
                row[f"{names[0]}_vs_{baseline}_min"] = row[f"{baseline}_min_ms"] / row[f"{names[0]}_min_ms"]
        print(f"trainer {model_name} fwd+bwd {num_seqs} x {seq_len} tokens  " + "  ".join(
            f"{k.removesuffix('_ms')} {v:.1f} ms" for k, v in row.items() if k.endswith("_ms") and "_all" not in k and "_min" not in k)
            + "".join(f"  {k} {v:.2f}" for k, v in row.items() if "_vs_" in k), flush=True)
        rows.append(row)
    return rows


LAYOUT_FIELDS = ("trainer_tp", "trainer_ep", "trainer_sp", "trainer_dp", "engine_tp", "engine_ep", "engine_sp", "engine_dp")
def _label(spec: str) -> str:
    """A contract's name in results: the preset's name, or a contract file's stem (and the entry's suffixes)."""
    base = variants.base(spec)
    return (Path(base).stem if base.endswith((".toml", ".json")) else base) + spec[len(base):]


def _commit() -> str:
    # The device machine gets the working tree without .git: pass ISOEXEC_COMMIT there.
    if os.environ.get("ISOEXEC_COMMIT"):
        return os.environ["ISOEXEC_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def _versions() -> dict:
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="*", metavar="SECTION", help=f"sections to run: {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="tiny sizes and the tiny-dense model: a CPU smoke run in seconds")
    parser.add_argument("--gdn-phases", default="training,prefill,decode,decode-chunk",
                        help="gdn: the phases to time, comma-separated (default: all four)")
    parser.add_argument("--gdn-inverse", choices=("products", "rows"), help="gdn: gdn.core.triton's `inverse` constant over the "
                        "contract's (default: the contract's)")
    parser.add_argument("--gdn-shapes", default="", help=f"gdn: the head shapes to time, comma-separated (default: all: "
                                                         f"{', '.join(GDN_SHAPES)})")
    parser.add_argument("--model", help=f"model presets, comma-separated (default: {','.join(FULL.models)}, or {','.join(SMALL.models)} with --small)")
    parser.add_argument("--rl-model", help=f"rl: model presets, comma-separated (default: {','.join(FULL.rl_models)}, or "
                                           f"{','.join(SMALL.rl_models)} with --small)")
    parser.add_argument("--rl-layout", default="", metavar="FIELD=N,...",
                        help="rl: each side's parallel layout as RLConfig fields, e.g. trainer_tp=4,trainer_ep=4,engine_tp=8 (default: "
                             "both sides in this process)")
    parser.add_argument("--contracts", help="contracts to compare, preset names or files, the one under test first (default: "
                                            f"{','.join(GPU_CONTRACTS)} on cuda, tiny-dense,native on cpu); a name ending in "
                                            f"{variants.SYNC} runs that contract's engine with async scheduling off, one in "
                                            f"{variants.GLUON} its engine and trainer with attention.triton's Gluon tile, one in {variants.BLOCKS} "
                                            "its decode calls of few programs with the key blocks spread over the grid")
    parser.add_argument("--new-tokens", type=int, help="new tokens per request in engine, hf and roofline (default: 128, or 8 with --small)")
    parser.add_argument("--prompt-len", type=int, help="prompt tokens per request in engine, hf and roofline (default: 128, or 16 with "
                                                       "--small): long contexts for the decode attention")
    parser.add_argument("--trainer-reps", type=int, default=7, help="trainer: timed steps per contract, taking turns (default: 7)")
    parser.add_argument("--cuda-graphs", action="store_true", help="run the engine with CUDA graphs (where EngineConfig has them)")
    parser.add_argument("--json", help="write the results here (rewritten after every section)")
    args = parser.parse_args(argv)
    unknown = [s for s in args.what if s not in SECTIONS]
    if unknown:  # checked here: argparse 3.11 refuses an empty list against `choices` for nargs="*"
        parser.error(f"unknown section(s) {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    for name in ("new_tokens", "prompt_len"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        args.rl_layout = {key: value.lower() == "true" if key.endswith("_sp") else int(value)
                          for key, value in (item.split("=") for item in args.rl_layout.split(",") if item)}
    except ValueError:
        parser.error(f"--rl-layout: expected FIELD=N pairs separated by commas, got {args.rl_layout!r}")
    unknown = sorted(set(args.rl_layout) - set(LAYOUT_FIELDS))
    if unknown:
        parser.error(f"--rl-layout: unknown field(s) {', '.join(unknown)} (known: {', '.join(LAYOUT_FIELDS)})")
    shapes = GDN_SMALL_SHAPES if args.small else GDN_SHAPES
    unknown = sorted(set(args.gdn_shapes.split(",")) - set(shapes) - {""})
    if unknown:
        parser.error(f"--gdn-shapes: unknown shape(s) {', '.join(unknown)} (known{' with --small' if args.small else ''}: {', '.join(shapes)})")
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    device = torch.device(args.device)
    sizes = SMALL if args.small else FULL
    if args.model:
        sizes = dataclasses.replace(sizes, models=tuple(args.model.split(",")))
    if args.new_tokens:
        sizes = dataclasses.replace(sizes, new_tokens=args.new_tokens)
    if args.prompt_len:
        sizes = dataclasses.replace(sizes, prompt_len=args.prompt_len)
    if args.rl_model:
        sizes = dataclasses.replace(sizes, rl_models=tuple(args.rl_model.split(",")))
    specs = args.contracts.split(",") if args.contracts else list(GPU_CONTRACTS if device.type == "cuda" else ("tiny-dense", "native"))
    try:
        loaded = {_label(spec): load(variants.base(spec)) for spec in specs}
    except ContractError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 2
    if len(loaded) != len(specs):
        print(f"bench: --contracts names one contract twice (labels: {', '.join(map(_label, specs))})", file=sys.stderr)
        return 2
    contracts = list(loaded)
    results = {"commit": _commit(), "device": device_name(device), **_versions(), "command": sys.argv if argv is None else ["bench.py", *argv],
               "sizes": dataclasses.asdict(sizes), "contracts": contracts, "section_seconds": {}}
    cuda_graphs = args.cuda_graphs and "cuda_graphs" in {f.name for f in dataclasses.fields(EngineConfig)}
    results["cuda_graphs"] = "unavailable" if args.cuda_graphs and not cuda_graphs else cuda_graphs
    if results["cuda_graphs"] == "unavailable":
        print("cuda graphs: unavailable (EngineConfig has no cuda_graphs setting); the engine runs eagerly")
    # moe, mla and gdn time their own layer shapes and contracts (their rows say which); --model and
    # --contracts are the model sections'.
    chosen = [s for s in SECTIONS if s in (args.what or SECTIONS)]
    model_sections = [s for s in chosen if s in MODEL_SECTIONS]
    print(f"bench: {results['device']}, torch {results['torch']}, commit {results['commit']}"
          + (f", models {', '.join(sizes.models)}, contracts {', '.join(contracts)}" if model_sections else ""), flush=True)

    # The model sections run where the first of them would, model by model: one model on the device at a time.
    jobs = []
    for section in chosen:
        if section not in MODEL_SECTIONS:
            jobs.append((section, None))
        elif section == model_sections[0]:
            jobs += [(s, name) for name in sizes.models for s in model_sections]
    model = engines = built = None
    failed = []
    for section, name in jobs:
        start = time.perf_counter()  # a section's seconds include building what it is first to need
        try:
            if name is not None and built != name:
                model = engines = built = None  # the previous model's weights and engines go before the next is built
                gc.collect()  # CUDA graphs and caches held in reference cycles
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                model, built = init_random(PRESETS[name], seed=0).to(device), name
            if section in ("engine", "hf", "roofline") and engines is None:
                engines = Engines(model, name, sizes, device, cuda_graphs, loaded)
            if section == "trainer" and engines is not None:
                engines.close()  # the trainer wants the KV caches' memory
                engines = None
            result = {
                "gemm": lambda: bench_gemm(sizes, device),
                "attention": lambda: bench_attention(sizes, device),
                "engine": lambda: bench_engine(engines, contracts),
                "hf": lambda: bench_hf(engines, contracts),
                "roofline": lambda: bench_roofline(engines, contracts),
                "trainer": lambda: bench_trainer(model, name, sizes, loaded, device, args.trainer_reps),
                "moe": lambda: bench_moe(device, *(((TINY,), (1, 4), (64,)) if args.small else (GPU_SHAPES,))),
                "mla": lambda: bench_mla(device, small=args.small),
                "gdn": lambda: bench_gdn(device, small=args.small, phases=args.gdn_phases, shapes=args.gdn_shapes, inverse=args.gdn_inverse),
                "rl": lambda: bench_rl(device, sizes.rl_models, {_label(s): s for s in specs if variants.base(s) == s},
                                       layout=args.rl_layout, **dict(zip(("prompts", "group", "new_tokens", "steps"), sizes.rl_shape))),
            }[section]()
        except Exception as error:  # noqa: BLE001  (one broken section must not lose the others' figures)
            traceback.print_exc()
            result = {"error": f"{type(error).__name__}: {error}"}
            failed.append(section if name is None else f"{section} ({name})")
        seconds = time.perf_counter() - start
        if name is None:
            results[section], results["section_seconds"][section] = result, seconds
        else:
            results.setdefault(section, {})[name] = result
            results["section_seconds"].setdefault(section, {})[name] = seconds
        print(f"{section}{'' if name is None else f' ({name})'}: {seconds:.1f} s", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n", "utf-8")
    if failed:
        print(f"bench: sections failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
