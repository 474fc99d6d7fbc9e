"""bench.py gdn: Gated DeltaNet's core (`gdn_core`) under the contract's impl vs flash-linear-attention, per
phase, at two GDN layer shapes (Qwen3.5-9B's and 35B-A3B's: 16 key heads, 32 value heads of 128; and 16
value heads of 128, one key head each).

- `contract`: the `gdn.core` entry of the contract under test (by default `tiny-hybrid-triton` on a GPU,
  `tiny-hybrid` on a CPU): chunk-form rows in every case, the engine's per-sequence cache (state at the
  open chunk's start and its rows);
- `fla`: flash-linear-attention's kernels as vLLM and transformers call them for these models,
  `chunk_gated_delta_rule` for training and prefill and `fused_recurrent_gated_delta_rule` for decode,
  with the same gating, l2 norms and q scale fused in (`use_gate_in_kernel`, `use_beta_sigmoid_in_kernel`,
  `use_qk_l2norm_in_kernel`) and the running state as the cache. Needs `fla-core` (carried as a wheel to
  the device: gpu_checks.sh, gdn-bench); without it the rows carry the contract's times alone.

Phases: training (packed sequences from position 0; forward alone as trainer_score runs it, and forward +
backward as trainer_fwd does), prefill (one chunk of a sequence after a cached context) and decode (a batch
of sequences one token each at a cached context; CUDA-graph replays where an impl
can be captured, as decode graphs run). The training forward and prefill are timed as the calls are made (eager,
the host's launches in the time) and also as CUDA-graph replays (`*_graph_ms`, `fla_vs_contract_graph`): the
device's work alone. FLA's eager calls spread with the host (0.6-1.5 ms for one 2048-token prefill over runs);
the replays say whether a ratio is the kernels' or the host's. The contract's training and prefill calls of long runs
take two launches whose tables come from the host, which a capture cannot see, so their graph replay is the one
launch instead: `*_kernels_ms` (`fla_vs_contract_kernels`, forward + backward too) sums each eager call's kernels
under torch.profiler, the device's time of the calls as made, like for like. Ratios: `fla_vs_contract` = the
contract's time / FLA's (the issue's "≤ 1.3×" goals read this way: below 1.3 meets them). Each row keeps max |contract - fla| over the
outputs, so a wrong kernel cannot pass as a fast one.
"""

import functools

import torch

from isoexec.contract import load
from isoexec.runtime.registry import REGISTRY
from timing import device_ms, graphed_ms, kernel_ms

SHAPES = {"hk16-hv32-d128": (16, 32, 128, 128), "hk16-hv16-d128": (16, 16, 128, 128)}
# Decode at a chunk's first offset (context 2048: the contract's step has no cached row to read) and its last
# (2048 + C - 1: it reads C - 1 cached rows and closes the chunk, writing the state); the second's output is not
# compared with FLA's (the open chunk's cached rows are random, FLA has only its state). `decode_chunk`: C steps
# in a row from a chunk's first offset to its last, one CUDA graph, the time per step (what a generation pays
# on average), outputs compared with FLA's over all C steps.
GPU = dict(contract="tiny-hybrid-triton", training=((8, 2048), (2, 4096)), prefill=((2048, 2048), (512, 2048)),
           decode=((1, 2048), (16, 2048), (64, 2048), (256, 2048), (1, -1), (64, -1), (256, -1)), decode_chunk=(1, 16, 64, 256))
SMALL = dict(contract="tiny-hybrid", training=((2, 80),), prefill=((40, 64),), decode=((1, 128), (4, 128)), decode_chunk=(2,))
TOKEN_INPUTS = ("q", "k", "v", "a", "b")
SMALL_SHAPES = {"hk2-hv4-d16": (2, 4, 16, 16)}


def _contract_op(name: str, **overrides):
    """The contract's gdn.core op (its constants, with `overrides` over them), its entry and its impl's row_width under
    those constants, as row_width(num_v_heads, k_dim, v_dim)."""
    entry = next(e for e in load(name).composition if e.region == "gdn.core")
    impl = REGISTRY.get(entry.impl.id, entry.impl.version)
    if "inverse" in overrides and entry.impl.id != "gdn.core.triton":
        raise ValueError(f"--gdn-inverse: {name}'s gdn.core is {impl.ref}, which has no `inverse` constant (gdn.core.triton has)")
    constants = {**dict(entry.constants), **overrides}
    return impl.bind(constants), entry, functools.partial(impl.row_width, constants=constants)


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as error:  # noqa: BLE001  (any import failure means: no baseline here)
        return None, f"{type(error).__name__}: {error}"
    return (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule), None


def _lift_fla_backward_guard() -> bool:
    """FLA 0.6.0 refuses its gated backward (`chunk_bwd_dqkwg`) under Triton 3.4 - 3.7.0 on Hopper, whose
    compiler gives that kernel wrong results (FLA issue #640); the device image has Triton 3.6. To have a
    time to compare with, the guard is lifted: the kernels run as they would under a fixed Triton, and only
    their time is used (each row keeps how far FLA's gradients are from the contract's). Returns whether a
    guard was there to lift."""
    try:
        from fla.ops.common import chunk_o
    except Exception:  # noqa: BLE001
        return False
    lifted = hasattr(chunk_o, "TRITON_ABOVE_3_7_1") and not chunk_o.TRITON_ABOVE_3_7_1
    chunk_o.TRITON_ABOVE_3_7_1 = True
    return lifted


def _inputs(shape, tokens: int, device, generator) -> dict:
    hk, hv, dk, dv = shape

    def randn(*size, scale=1.0):
        return (torch.randn(*size, generator=generator, device=device) * scale).to(torch.bfloat16)

    return dict(q=randn(tokens, hk, dk), k=randn(tokens, hk, dk), v=randn(tokens, hv, dv), a=randn(tokens, hv), b=randn(tokens, hv),
                a_log=torch.rand(hv, generator=generator, device=device).log(), dt_bias=torch.rand(hv, generator=generator, device=device))


def _fla_chunk(fla, x, cu, initial=None):
    chunk, _ = fla
    out, final = chunk(x["q"][None], x["k"][None], x["v"][None], x["a"][None], x["b"][None], initial_state=initial,
                       output_final_state=initial is not None, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["a_log"],
                       dt_bias=x["dt_bias"], use_beta_sigmoid_in_kernel=True, cu_seqlens=cu)
    return out[0]


def _fla_decode(fla, x, state):
    return _fla_step(fla, x, state)[0]


def _fla_step(fla, x, state):
    """One recurrent decode step of FLA for x's tokens (a sequence each) -> (outputs, the states after it)."""
    _, recurrent = fla
    out, final = recurrent(x["q"][:, None], x["k"][:, None], x["v"][:, None], x["a"][:, None], beta=x["b"][:, None], initial_state=state,
                       output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x["a_log"], dt_bias=x["dt_bias"],
                       use_beta_sigmoid_in_kernel=True)
    return out[:, 0], final


def _cache(shape, num_seqs: int, chunk: int, width: int, device, generator):
    """A cache slot per sequence: a random state and random open-chunk rows of `width` floats (the impl's
    `row_width`; read only past a chunk offset of 0: the phases start at chunk boundaries, so the contract's
    output compares with FLA's from the same state)."""
    hk, hv, dk, dv = shape
    state = torch.randn(num_seqs, hv, dk, dv, generator=generator, device=device) * 0.05
    rows = torch.randn(num_seqs, chunk, hv, width, generator=generator, device=device) * 0.05
    return state, rows


def _cached_phase(op, fla, x, shape, num_seqs, chunk, width, ids, positions, cu, device, generator, row, graph: bool) -> dict:
    """Time a prefill (cu given) or decode call of both impls from one cache; returns their outputs."""
    state, cache_rows = _cache(shape, num_seqs, chunk, width, device, generator)

    def contract(s, r):
        return op(x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"], s, r, ids, positions)

    def native(s, r):
        return _fla_chunk(fla, x, cu, s) if cu is not None else _fla_decode(fla, x, s)

    return _both(contract, native if fla is not None else None, state, cache_rows, device, graph, row, also_graphed=not graph)


def _both(contract, native, state, cache_rows, device, graph: bool, row: dict, calls: int = 1, also_graphed: bool = False) -> dict:
    """Each impl's outputs from one cache, then its time per call (fn makes `calls` calls) into the row; with
    `also_graphed` (eager calls), its time as a graph replay and its kernels' device time too."""
    outputs = {}
    with torch.no_grad():
        for name, fn in (("contract", contract), ("fla", native))[: 1 + (native is not None)]:
            outputs[name] = fn(state.clone(), cache_rows.clone())
            # The timed calls write their slots in place, as the engine's do.
            s, r = state.clone(), cache_rows.clone()
            _timed(lambda: fn(s, r), device, graph, row, name)
            row[f"{name}_ms"] /= calls
            if also_graphed:
                _graph_ms(lambda: fn(s, r), device, row, name)
                _kernels_ms(lambda: fn(s, r), device, row, name)
    return outputs


def _decode_chunk(op, fla, x, shape, batch, chunk, width, device, generator, row) -> dict:
    """C decode steps of `batch` sequences from a chunk's first offset to its last, each impl's C steps captured
    as one CUDA graph; the time per step in the row, each impl's stacked outputs returned (from one state)."""
    state, cache_rows = _cache(shape, batch, chunk, width, device, generator)
    ids = torch.arange(batch, device=device)
    steps = [{k: (t[i * batch : (i + 1) * batch] if k in TOKEN_INPUTS else t) for k, t in x.items()} for i in range(chunk)]
    positions = [torch.full((batch,), 2048 + i, device=device) for i in range(chunk)]

    def contract(s, r):
        return torch.stack([op(t["q"], t["k"], t["v"], t["a"], t["b"], t["a_log"], t["dt_bias"], s, r, ids, p)
                            for t, p in zip(steps, positions)])

    def native(s, r):
        outs = []
        for t in steps:
            out, s = _fla_step(fla, t, s)
            outs.append(out)
        return torch.stack(outs)

    return _both(contract, native if fla is not None else None, state, cache_rows, device, True, row, calls=chunk)


def _graph_ms(fn, device, row: dict, name: str) -> None:
    """The call's time as a CUDA-graph replay into row[name + "_graph_ms"] (on a GPU, where it can be captured; the
    reason in row[name + "_graph_error"] where not)."""
    if device.type != "cuda":
        return
    try:
        row[f"{name}_graph_ms"] = graphed_ms(fn, device)
    except RuntimeError as error:
        row[f"{name}_graph_error"] = str(error).splitlines()[0][:160]
        torch.cuda.synchronize(device)


def _kernels_ms(fn, device, row: dict, name: str) -> None:
    """The call's kernels' device time into row[name + "_kernels_ms"] (on a GPU): the eager calls of training and prefill
    cannot be captured by the contract's two-launch path (its runs are read on the host), and FLA's eager calls are
    bound by the host, so this is the like-for-like device time of both."""
    ms = device_ms(fn, device)
    if ms is not None:
        row[f"{name}_kernels_ms"] = ms


def _timed(fn, device, graph: bool, row: dict, name: str) -> None:
    if graph and device.type == "cuda":
        try:
            row[f"{name}_ms"] = graphed_ms(fn, device)
            return
        except RuntimeError as error:  # an impl that cannot be captured: eager launches, and the row says so
            row[f"{name}_graph_error"] = str(error).splitlines()[0][:160]
            torch.cuda.synchronize(device)
    row[f"{name}_ms"] = kernel_ms(fn, device)


def bench_gdn(device: torch.device, small: bool = False, contract: str | None = None,
              phases: str = "training,prefill,decode,decode-chunk", shapes: str = "", inverse: str | None = None) -> list[dict]:
    """`inverse`: gdn.core.triton's `inverse` constant over the contract's (None: the contract's)."""
    sizes = dict(SMALL if small else GPU)
    all_shapes = SMALL_SHAPES if small else SHAPES
    for phase in {"training", "prefill", "decode", "decode-chunk"} - set(phases.split(",")):
        sizes[phase.replace("-", "_")] = ()
    op, entry, row_width = _contract_op(contract or (sizes["contract"] if device.type == "cuda" else SMALL["contract"]),
                                        **({"inverse": inverse} if inverse else {}))
    if inverse:
        print(f"gdn: the contract's gdn.core with inverse = {inverse!r}", flush=True)
    chunk = entry.constants["chunk_size"]
    fla, why = _fla() if device.type == "cuda" else (None, "needs a CUDA device")
    if fla is None:
        print(f"gdn: no flash-linear-attention baseline ({why})", flush=True)
    fla_guard_lifted = fla is not None and _lift_fla_backward_guard()
    if fla_guard_lifted:
        print("gdn: FLA's gated backward runs with its Triton-version guard lifted (issue #640): timed, its gradients not trusted",
              flush=True)
    generator = torch.Generator(device=device).manual_seed(0)
    rows = []

    def record(row: dict, outputs: dict) -> None:
        if "fla" in outputs and row.get("context", 0) % chunk == 0:
            row["contract_max_abs_diff_vs_fla"] = float((outputs["contract"].float() - outputs["fla"].float()).abs().max())
        for timing, ratio in (("ms", "fla_vs_contract"), ("fwd_bwd_ms", "fla_vs_contract_fwd_bwd"), ("graph_ms", "fla_vs_contract_graph"),
                              ("kernels_ms", "fla_vs_contract_kernels"), ("fwd_bwd_kernels_ms", "fla_vs_contract_fwd_bwd_kernels")):
            if f"contract_{timing}" in row and f"fla_{timing}" in row:
                row[ratio] = row[f"contract_{timing}"] / row[f"fla_{timing}"]
        keys = ("seqs", "seq_len", "batch", "context", "chunk", "steps")
        print(f"gdn {row['shape']} {row['phase']:<8} " + "  ".join(f"{k} {row[k]}" for k in keys if k in row)
              + "  " + "  ".join(f"{k.removesuffix('_ms')} {v:.3f} ms" for k, v in row.items() if k.endswith("_ms"))
              + "".join(f"  {k} {v:.2f}" for k, v in row.items() if "_vs_" in k and "diff" not in k)
              + (f"  max|diff| {row['contract_max_abs_diff_vs_fla']:.2e}" if "contract_max_abs_diff_vs_fla" in row else "")
              + (f"  grad rel diff {row['grad_rel_diff_vs_fla']:.1e}" if "grad_rel_diff_vs_fla" in row else ""), flush=True)
        rows.append(row)

    for shape_name, shape in all_shapes.items():
        if shapes and shape_name not in shapes.split(","):
            continue
        for seqs, seq_len in sizes["training"]:
            x = _inputs(shape, seqs * seq_len, device, generator)
            positions = torch.arange(seq_len, device=device).repeat(seqs)
            cu = torch.arange(seqs + 1, device=device) * seq_len
            row, outputs, grads = {"shape": shape_name, "phase": "training", "seqs": seqs, "seq_len": seq_len}, {}, {}
            fns = {"contract": lambda **t: op(t["q"], t["k"], t["v"], t["a"], t["b"], t["a_log"], t["dt_bias"], positions=positions)}
            if fla is not None:
                fns["fla"] = lambda **t: _fla_chunk(fla, t, cu)
            for name, fn in fns.items():
                with torch.no_grad():
                    outputs[name] = fn(**x)
                    row[f"{name}_ms"] = kernel_ms(lambda: fn(**x), device)
                    _graph_ms(lambda: fn(**x), device, row, name)
                    _kernels_ms(lambda: fn(**x), device, row, name)
                leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
                grad = torch.randn(outputs[name].shape, generator=torch.Generator(device=device).manual_seed(1), device=device,
                                   dtype=outputs[name].dtype)

                def step():
                    fn(**leaves).backward(grad)
                    grads[name] = {k: t.grad for k, t in leaves.items()}
                    for t in leaves.values():
                        t.grad = None

                try:
                    row[f"{name}_fwd_bwd_ms"] = kernel_ms(step, device)
                    _kernels_ms(step, device, row, f"{name}_fwd_bwd")
                except RuntimeError as error:  # e.g. FLA's guard, where it could not be lifted
                    row[f"{name}_fwd_bwd_error"] = str(error).splitlines()[0][:200]
            if len(grads) == 2:  # the largest relative difference (norm) of an input's gradient, FLA's against the contract's
                row["fla_guard_lifted"] = fla_guard_lifted
                row["grad_rel_diff_vs_fla"] = max(float((grads["fla"][k].float() - g.float()).norm() / g.float().norm())
                                                  for k, g in grads["contract"].items() if k in TOKEN_INPUTS)
            record(row, outputs)

        for length, context in sizes["prefill"]:
            x = _inputs(shape, length, device, generator)
            positions = context + torch.arange(length, device=device)
            ids = torch.zeros(length, dtype=torch.long, device=device)
            cu = torch.tensor([0, length], device=device)
            row = {"shape": shape_name, "phase": "prefill", "chunk": length, "context": context}
            record(row, _cached_phase(op, fla, x, shape, 1, chunk, row_width(*shape[1:]), ids, positions, cu, device, generator, row,
                                      graph=False))

        for batch, context in sizes["decode"]:
            context = 2048 + chunk - 1 if context == -1 else context  # -1: a chunk's last offset
            x = _inputs(shape, batch, device, generator)
            positions = torch.full((batch,), context, device=device)
            ids = torch.arange(batch, device=device)
            row = {"shape": shape_name, "phase": "decode", "batch": batch, "context": context}
            record(row, _cached_phase(op, fla, x, shape, batch, chunk, row_width(*shape[1:]), ids, positions, None, device, generator, row,
                                      graph=True))
        for batch in sizes["decode_chunk"]:
            row = {"shape": shape_name, "phase": "decode chunk", "batch": batch, "context": 2048, "steps": chunk}
            record(row, _decode_chunk(op, fla, _inputs(shape, batch * chunk, device, generator), shape, batch, chunk, row_width(*shape[1:]),
                                      device, generator, row))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
