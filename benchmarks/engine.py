"""bench.py engine, hf and roofline: one set of engine runs, read three ways.

Every run is `LLMEngine.generate` on `batch` random prompts of `prompt_len` tokens, `new_tokens` new
tokens each (temperature 1, ignore_eos), after a warm-up generate of the same batch and 4 tokens (so
kernels are compiled for the same shapes), timed REPS times; a run's tokens/s is the median's (one
timed generate per contract gave 0.82 and 1.04 of the baseline at batch 64 in two runs of the same code
on an H200 at bb94c8d, docs/experiments.md). `engine.step` is wrapped to take the wall time of every step,
with nothing extra synchronised: a step ends in the host's read of the tokens drawn by the step before it
(async scheduling; with it off, by the step itself), so in a run of decode steps a step's wall time is the
interval from one step to the next. A contract label ending in +sync runs with async scheduling off, one in +gluon
with attention.triton's Gluon tile, one in +blocks with decode's key blocks spread over the grid (variants.py):

engine:   tokens/s = batch x new_tokens / median wall time of the whole generate (prefill included),
          per contract, and the first contract's ratio to each of the others (the baselines);
hf:       the same model, weights and prompts in Hugging Face `generate` (sdpa attention, left padded,
          do_sample, min_new_tokens = max_new_tokens so both draw the same number of tokens), and the
          engine's tokens/s over HF's;
roofline: the decode step time (median over the steps that decode the whole batch and prefill
          nothing) vs bytes / copy bandwidth, where bytes = every weight once (the tied embedding once:
          lm_head reads it whole; an untied embedding table not at all) + the K and V of every key each
          sequence attends to, and copy bandwidth = (bytes read + written) / time of one large
          device-to-device copy.
"""

import dataclasses
import importlib.util
import statistics
import tempfile
import time

import torch

from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
from isoexec.contract import fit_contract
from isoexec.model import save
from timing import kernel_ms, sync
import variants

WARMUP_TOKENS = 4
# Timed generates per (contract, batch).
REPS = 3


@dataclasses.dataclass
class Run:
    contract: str
    batch: int
    tokens_per_s: float  # of the median wall time
    wall_s: float  # median over REPS generates
    all_tokens_per_s: list[float]
    decode_step_ms: float | None  # median over full-batch, decode-only steps
    decode_steps: int
    kv_tokens_per_step: float | None  # keys read per decode step, summed over the batch (mean over those steps)
    steps: int


class Engines:
    """One engine per contract (sized for the largest batch), each (contract, batch) run once and kept."""

    def __init__(self, model, name: str, sizes, device: torch.device, cuda_graphs: bool, contracts: dict):
        """name: the model's preset; contracts: label -> Contract (bench.py's --contracts, loaded)."""
        self.model, self.name, self.sizes, self.device, self.cuda_graphs = model, name, sizes, device, cuda_graphs
        self.contracts = contracts
        generator = torch.Generator().manual_seed(0)
        spec = model.spec
        self.prompts = [torch.randint(spec.vocab_size, (sizes.prompt_len,), generator=generator).tolist() for _ in range(max(sizes.batches))]
        self.engines, self.runs = {}, {}  # runs: (contract, batch) -> Run, or the error it raised
        self.eager_decode = {}  # contract -> why its decode steps could not be captured

    def _engine(self, name: str):
        if name not in self.engines:
            contract = fit_contract(self.contracts[name], self.model.spec, device=self.device)
            page_size = contract.deployment.engine.kv_page_size
            pages_per_seq = -(-(self.sizes.prompt_len + self.sizes.new_tokens) // page_size) + 1
            max_batch = max(self.sizes.batches)
            # max_model_len: the decode graphs' slot table is as wide as the longest request, not the
            # model's context (native's decode attention scans the table whole).
            overrides = {"max_num_seqs": max_batch, "max_model_len": self.sizes.prompt_len + self.sizes.new_tokens,
                         "async_scheduling": not variants.has(name, variants.SYNC)}
            if self.cuda_graphs:
                overrides["cuda_graphs"] = True
            config = EngineConfig.from_contract(contract, num_pages=max_batch * pages_per_seq + 8, **overrides)
            try:
                self.engines[name] = LLMEngine(self.model, contract, config, device=str(self.device))
            except RuntimeError as error:  # a contract whose ops wait on the host (native MoE) cannot be captured
                if not config.cuda_graphs or "CUDA graph" not in str(error):
                    raise
                print(f"engine {name}: decode runs eagerly ({str(error).splitlines()[0][:120]})", flush=True)
                self.eager_decode[name] = str(error).splitlines()[0]
                config = EngineConfig.from_contract(contract, num_pages=config.num_pages, **{**overrides, "cuda_graphs": False})
                self.engines[name] = LLMEngine(self.model, contract, config, device=str(self.device))
        return self.engines[name]

    def run(self, name: str, batch: int) -> Run:
        if (name, batch) not in self.runs:
            try:
                with variants.kernels(name):  # the engine is built (its decode graphs captured) and run inside
                    self.runs[name, batch] = self._run(name, batch)
            except (RuntimeError, ValueError) as error:  # kept (without its frames, which may hold device memory),
                self.runs[name, batch] = RuntimeError(f"{type(error).__name__}: {error}")  # so it costs its time once
        if isinstance(self.runs[name, batch], Exception):
            raise self.runs[name, batch]
        return self.runs[name, batch]

    def _run(self, name: str, batch: int) -> Run:
        engine, sizes = self._engine(name), self.sizes
        prompts = self.prompts[:batch]
        engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=WARMUP_TOKENS, ignore_eos=True), progress=False)
        steps = _time_steps(engine)
        params = SamplingParams(temperature=1.0, max_tokens=sizes.new_tokens, ignore_eos=True)
        walls = []
        try:
            for _ in range(REPS):
                sync(self.device)
                start = time.perf_counter()
                completions = engine.generate(prompts, params, progress=False)
                sync(self.device)
                walls.append(time.perf_counter() - start)
                short = [c.request_id for c in completions if len(c.token_ids) != sizes.new_tokens]
                if short:
                    raise RuntimeError(f"{name}: requests {short[:5]} did not generate {sizes.new_tokens} tokens")
        finally:
            del engine.step  # back to the class's step
        decodes = [(seconds, kv_tokens) for seconds, prefill_chunks, decoded, kv_tokens in steps if not prefill_chunks and decoded == batch]
        wall, tokens = statistics.median(walls), batch * sizes.new_tokens
        return Run(name, batch, tokens / wall, wall, [tokens / w for w in walls],
                   statistics.median(s for s, _ in decodes) * 1e3 if decodes else None, len(decodes),
                   statistics.fmean(k for _, k in decodes) if decodes else None, len(steps) // REPS)

    def close(self) -> None:
        self.engines.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _time_steps(engine) -> list[tuple[float, int, int, int]]:
    """Wrap engine.step: -> a list filled with (seconds, prefill chunks, decoded tokens, keys read by
    the decodes) per step. Keys read: a decoding sequence of n tokens attends to n keys."""
    steps, step = [], engine.step

    def timed_step():
        stats = dict(engine.stats)
        kv_tokens = sum(len(seq) for seq in engine.scheduler.running)
        start = time.perf_counter()
        finished = step()
        steps.append((time.perf_counter() - start, engine.stats["prefill_chunks"] - stats["prefill_chunks"],
                      engine.stats["decode_tokens"] - stats["decode_tokens"], kv_tokens))
        return finished

    engine.step = timed_step
    return steps


def bench_engine(engines: Engines, contracts: list[str]) -> list[dict]:
    rows = []
    for batch in engines.sizes.batches:
        row = {"model": engines.name, "batch": batch, "prompt_tokens": engines.sizes.prompt_len, "new_tokens": engines.sizes.new_tokens}
        for name in contracts:
            try:
                run = engines.run(name, batch)
            except (RuntimeError, ValueError) as error:  # e.g. out of memory, a contract the model cannot run
                print(f"engine {name} batch {batch}: failed ({str(error).splitlines()[0]})")
                row[f"{name}_error"] = str(error).splitlines()[0]
                continue
            row[f"{name}_tokens_per_s"] = run.tokens_per_s
            row[f"{name}_all_tokens_per_s"] = run.all_tokens_per_s
            row[f"{name}_decode_step_ms"] = run.decode_step_ms
            if name in engines.eager_decode:
                row[f"{name}_eager_decode"] = engines.eager_decode[name]
        for baseline in contracts[1:]:
            if f"{contracts[0]}_tokens_per_s" in row and f"{baseline}_tokens_per_s" in row:
                row[f"{contracts[0]}_vs_{baseline}"] = row[f"{contracts[0]}_tokens_per_s"] / row[f"{baseline}_tokens_per_s"]
        rows.append(row)
        print(f"engine {row['model']} batch {batch:<3} " + "  ".join(
            f"{k.removesuffix('_tokens_per_s')} {v:.0f} tok/s" for k, v in row.items() if k.endswith("_tokens_per_s") and "_all_" not in k)
            + "".join(f"  {k} {v:.2f}" for k, v in row.items() if "_vs_" in k), flush=True)
    return rows


def _hf_model(model, device: torch.device):
    """Hugging Face's own implementation of the model, loaded from our weights saved as a checkpoint."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as directory:
        save(model, directory)
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, model.spec.dtype), attn_implementation="sdpa")
    return hf.to(device).eval()


def _left_padded(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def _hf_row(hf, engines: Engines, contracts: list[str], batch: int) -> dict:
    sizes, device = engines.sizes, engines.device
    ids, mask = _left_padded(engines.prompts[:batch], 0, device)

    def generate(num_tokens):
        return hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           max_new_tokens=num_tokens, min_new_tokens=num_tokens, pad_token_id=0)

    with torch.no_grad():
        generate(WARMUP_TOKENS)
        sync(device)
        start = time.perf_counter()
        out = generate(sizes.new_tokens)
        sync(device)
        wall = time.perf_counter() - start
    if out.shape[1] != ids.shape[1] + sizes.new_tokens:
        raise RuntimeError(f"hf generate returned {out.shape[1] - ids.shape[1]} new tokens, expected {sizes.new_tokens}")
    row = {"model": engines.name, "batch": batch, "new_tokens": sizes.new_tokens, "hf_tokens_per_s": batch * sizes.new_tokens / wall}
    for name in contracts:
        try:
            row[f"{name}_tokens_per_s"] = engines.run(name, batch).tokens_per_s
            row[f"{name}_vs_hf"] = row[f"{name}_tokens_per_s"] / row["hf_tokens_per_s"]
        except (RuntimeError, ValueError) as error:
            row[f"{name}_error"] = str(error).splitlines()[0]
    print(f"hf {engines.name} batch {batch:<3} hf {row['hf_tokens_per_s']:.0f} tok/s  " + "  ".join(
        f"{name} {row[f'{name}_tokens_per_s']:.0f} tok/s ({row[f'{name}_vs_hf']:.2f}x hf)" for name in contracts if f"{name}_vs_hf" in row), flush=True)
    return row


def bench_hf(engines: Engines, contracts: list[str]) -> list[dict] | dict:
    if importlib.util.find_spec("transformers") is None:
        print("hf: skipped (transformers is not installed)")
        return {"skipped": "transformers is not installed"}
    hf = _hf_model(engines.model, engines.device)
    try:
        return [_hf_row(hf, engines, contracts, batch) for batch in engines.sizes.batches]
    finally:
        del hf
        if engines.device.type == "cuda":
            torch.cuda.empty_cache()


def copy_bandwidth(device: torch.device, num_bytes: int) -> float:
    """Bytes read + written per second by one device-to-device copy of num_bytes."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = kernel_ms(lambda: dst.copy_(src), device)
    return 2 * num_bytes / (ms / 1e3)


def bench_roofline(engines: Engines, contracts: list[str]) -> dict:
    spec, sizes = engines.model.spec, engines.sizes
    bandwidth = copy_bandwidth(engines.device, sizes.copy_bytes)
    # A tied embedding is listed once and lm_head reads it whole; an untied one is read a row a sequence.
    embedding = engines.model.model.embed_tokens.weight
    weight_bytes = sum(p.numel() * p.element_size() for p in engines.model.parameters() if p is not embedding or spec.tie_word_embeddings)
    kv_bytes_per_key = sum(2 * s.num_kv_heads * s.head_dim for s in (layer.state() for layer in spec.layers) if s) * torch.finfo(getattr(torch, spec.dtype)).bits // 8
    print(f"roofline {engines.name}: copy bandwidth {bandwidth / 1e9:.0f} GB/s (copy of {sizes.copy_bytes / 2**30:.2f} GiB), weights {weight_bytes / 1e9:.3f} GB, "
          f"KV {kv_bytes_per_key} bytes per key (all layers)", flush=True)
    rows = []
    for name in contracts:
        for batch in sizes.batches:
            row = {"contract": name, "batch": batch}
            try:
                run = engines.run(name, batch)
                if run.decode_step_ms is None:
                    raise RuntimeError("no decode-only step of the whole batch to time")
            except (RuntimeError, ValueError) as error:
                row["error"] = str(error).splitlines()[0]
                rows.append(row)
                print(f"roofline {engines.name} {name} batch {batch}: failed ({row['error']})")
                continue
            step_bytes = weight_bytes + run.kv_tokens_per_step * kv_bytes_per_key
            roofline_ms = step_bytes / bandwidth * 1e3
            row.update(decode_step_ms=run.decode_step_ms, decode_steps=run.decode_steps, mean_context=run.kv_tokens_per_step / batch,
                       bytes_per_step=step_bytes, roofline_ms=roofline_ms, fraction_of_roofline=roofline_ms / run.decode_step_ms)
            rows.append(row)
            print(f"roofline {engines.name} {name} batch {batch:<3} decode step {run.decode_step_ms:.2f} ms (median of {run.decode_steps}), "
                  f"roofline {roofline_ms:.3f} ms ({step_bytes / 1e9:.3f} GB): {row['fraction_of_roofline']:.1%} of roofline", flush=True)
    return {"model": engines.name, "copy_bandwidth_gbps": bandwidth / 1e9, "copy_bytes": sizes.copy_bytes, "weight_bytes": weight_bytes,
            "kv_bytes_per_key": kv_bytes_per_key, "rows": rows}
