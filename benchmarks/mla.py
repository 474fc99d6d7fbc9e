"""bench.py mla: multi-head latent attention (`mla_attn`) under the contract's impl vs native, per phase,
at a model's MLA shapes (GLM-4.7-Flash's on a GPU: 20 heads, nope 192 + rope 64, v 256, latent 512).

- `contract`: the `mla` entry of the contract under test (by default `tiny-mla-triton` on a GPU, `tiny-mla`
  on a CPU) fitted to the model, bound as its engine and trainer bind it: one absorbed form in every case;
- `native`: `mla.native`, the two-form engine path (decompressed K/V and SDPA for prefill and training,
  absorbed for decode).

Phases: training (packed sequences, forward alone as trainer_score runs it and forward + backward as
trainer_fwd does), prefill (one chunk of a sequence after a cached context) and decode (a batch of
sequences with a cached context each, one query per sequence; CUDA-graph replays on a GPU, as decode
graphs run). The cache is paged (pages in random order); its rows are random, never zeros. Ratios:
`contract_vs_native` = native's time / the contract's (above 1: the contract is faster). Each row keeps
max |contract - native| over the outputs, so a wrong kernel cannot pass as a fast one.
"""

import torch

from isoexec.contract import fit_contract, load
from isoexec.model import PRESETS
from isoexec.ops.attention.metadata import packed_slot_table, paged_slot_table
from isoexec.runtime.binding import bind
from timing import graphed_ms, kernel_ms

PAGE_SIZE = 32
GPU = dict(model="glm-4.7-flash-4l-random", contract="tiny-mla-triton", training=((8, 2048), (4, 4096)), prefill=((2048, 0), (2048, 8192)),
           decode=((1, 2048), (16, 2048), (64, 2048), (64, 8192)))
SMALL = dict(model="tiny-mla", contract="tiny-mla", training=((2, 32),), prefill=((16, 16),), decode=((1, 32), (4, 32)))


def _impls(contract_name: str, spec, device: torch.device) -> dict:
    """name -> the bound mla_attn op of each case it is timed in (trainer_fwd, engine_prefill, engine_decode)."""
    cases = ("trainer_fwd", "engine_prefill", "engine_decode")
    impls = {}
    for name, source in (("contract", contract_name), ("native", "native")):
        contract = fit_contract(load(source), spec, device=device.type)
        ops = bind(contract, spec, cases).ops
        impls[name] = {case: ops[case]["mla_attn"] for case in cases}
    return impls


def _inputs(spec, tokens: int, slots: int, device, generator) -> dict:
    mla = spec.mla[0]
    h, dn, dr, r, dv = mla.num_heads, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.kv_lora_rank, mla.v_head_dim
    dtype = getattr(torch, spec.dtype)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, device=device) * scale).to(dtype)

    return dict(q_nope=randn(tokens, h, dn), q_rope=randn(tokens, h, dr), rows=randn(slots, r + dr), kv_b=randn(h * (dn + dv), r, scale=r**-0.5),
                scale=mla.scale)


def _paged(batch: int, context: int, queries: int, device, generator):
    """Metadata of `batch` sequences of `context` cached keys then `queries` new ones, in shuffled pages:
    (slot_table, seq_ids, positions, slots)."""
    keys = context + queries
    pages = -(-keys // PAGE_SIZE)
    order = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(1)).to(device)
    table = paged_slot_table(order.view(batch, pages), PAGE_SIZE, keys)
    seq_ids = torch.arange(batch, device=device).repeat_interleave(queries)
    positions = (context + torch.arange(queries, device=device)).repeat(batch)
    return table, seq_ids, positions, batch * pages * PAGE_SIZE


def _timed(fn, device, graph: bool) -> float:
    return graphed_ms(fn, device) if graph and device.type == "cuda" else kernel_ms(fn, device)


def bench_mla(device: torch.device, small: bool = False, contract: str | None = None) -> list[dict]:
    sizes = SMALL if small else GPU
    spec = PRESETS[sizes["model"]]
    impls = _impls(contract or (sizes["contract"] if device.type == "cuda" else SMALL["contract"]), spec, device)
    generator = torch.Generator(device=device).manual_seed(0)
    rows = []

    def record(row: dict, outputs: dict) -> None:
        row["contract_max_abs_diff_vs_native"] = float((outputs["contract"].float() - outputs["native"].float()).abs().max())
        for timing, ratio in (("ms", "contract_vs_native"), ("fwd_bwd_ms", "contract_vs_native_fwd_bwd")):
            if f"contract_{timing}" in row and f"native_{timing}" in row:
                row[ratio] = row[f"native_{timing}"] / row[f"contract_{timing}"]
        print(f"mla {row['phase']:<8} " + "  ".join(f"{k} {v}" for k, v in row.items() if k in ("seqs", "seq_len", "batch", "context", "chunk"))
              + "  " + "  ".join(f"{k.removesuffix('_ms')} {v:.3f} ms" for k, v in row.items() if k.endswith("_ms"))
              + "".join(f"  {k} {v:.2f}" for k, v in row.items() if "_vs_" in k and "diff" not in k), flush=True)
        rows.append(row)

    for seqs, seq_len in sizes["training"]:
        cu = torch.arange(seqs + 1, device=device) * seq_len
        table, seq_ids, positions = packed_slot_table(cu)
        x = _inputs(spec, seqs * seq_len, seqs * seq_len, device, generator)
        row, outputs = {"phase": "training", "seqs": seqs, "seq_len": seq_len}, {}
        for name, ops in impls.items():
            op = ops["trainer_fwd"]
            with torch.no_grad():
                outputs[name] = op(x["q_nope"], x["q_rope"], x["rows"], x["kv_b"], table, seq_ids, positions, x["scale"], packed_len=seq_len)
                row[f"{name}_ms"] = _timed(lambda: op(x["q_nope"], x["q_rope"], x["rows"], x["kv_b"], table, seq_ids, positions, x["scale"],
                                                      packed_len=seq_len), device, False)
            leaves = [x[k].clone().requires_grad_() for k in ("q_nope", "q_rope", "rows", "kv_b")]
            grad = torch.randn_like(outputs[name])

            def step():
                op(*leaves, table, seq_ids, positions, x["scale"], packed_len=seq_len).backward(grad)
                for t in leaves:
                    t.grad = None

            row[f"{name}_fwd_bwd_ms"] = _timed(step, device, False)
        record(row, outputs)

    for chunk, context in sizes["prefill"]:
        table, seq_ids, positions, slots = _paged(1, context, chunk, device, generator)
        x = _inputs(spec, chunk, slots, device, generator)
        row, outputs = {"phase": "prefill", "chunk": chunk, "context": context}, {}
        with torch.no_grad():
            for name, ops in impls.items():
                op = ops["engine_prefill"]
                outputs[name] = op(x["q_nope"], x["q_rope"], x["rows"], x["kv_b"], table, seq_ids, positions, x["scale"])
                row[f"{name}_ms"] = _timed(lambda: op(x["q_nope"], x["q_rope"], x["rows"], x["kv_b"], table, seq_ids, positions, x["scale"]),
                                           device, False)
        record(row, outputs)

    for batch, context in sizes["decode"]:
        table, seq_ids, positions, slots = _paged(batch, context, 1, device, generator)
        x = _inputs(spec, batch, slots, device, generator)
        row, outputs = {"phase": "decode", "batch": batch, "context": context}, {}
        with torch.no_grad():
            for name, ops in impls.items():
                op = ops["engine_decode"]
                outputs[name] = op(x["q_nope"], x["q_rope"], x["rows"], x["kv_b"], table, seq_ids, positions, x["scale"])
                try:
                    row[f"{name}_ms"] = _timed(lambda: op(x["q_nope"], x["q_rope"], x["rows"], x["kv_b"], table, seq_ids, positions, x["scale"]),
                                               device, True)
                except RuntimeError as error:  # an impl that cannot be captured
                    row[f"{name}_graph_error"] = str(error).splitlines()[0]
        record(row, outputs)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
