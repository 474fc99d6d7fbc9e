"""Parity with Hugging Face transformers: our model and transformers' own implementation of the same
architecture, run on the same weights and tokens, must give the same log-probabilities.

`compare` loads a checkpoint directory twice — into our `Decoder` (packed batch, `trainer_score`
case, contract ops) and into `AutoModelForCausalLM` (eager attention, one sequence at a time with
explicit `position_ids`) — and measures over every position and the whole vocabulary:

- max |Δ logprob|: ours against transformers';
- max relative logit error: ‖Δ logits‖ / ‖transformers' logits‖ per token row, max over rows.

Tolerances. Both sides compute the same function; they differ only in rounding. Transformers rounds
to the model dtype after nearly every step (RMSNorm rounds x·rsqrt before the weight multiply, RoPE
rounds cos/sin and each product, attention rounds its softmax before P·V, residual adds round), with
BLAS summation orders; ours accumulates each op in fp32 in a fixed order and rounds once at the op
boundary, with a float64-built RoPE table. So each side carries its own rounding error e against the
exact function, and |ours − HF| ≤ e_ours + e_HF. We estimate the exact function by running the same
transformers model one precision up (bfloat16 → float32, float32 → float64; the weights are upcast
exactly, so it is the same model) and measure e_HF directly. transformers casts to float32 by name
in places (RMSNorm, Gated DeltaNet's delta rule and conv); during the reference run its modeling module
reads `torch.float32` as float64, so those steps keep the reference's precision too (`Tensor.float()`
calls still round). Our model is meant to be at least as accurate as transformers' (it rounds less),
so e_ours ≤ e_HF and the bound becomes |ours − HF| ≤ 2·e_HF: that is the tolerance, per metric (over
72 runs of tiny Qwen3/Qwen2/Llama models, seeds and dtypes, measured while the reference's RMSNorm
still ran in float32, |ours − HF| / e_HF stayed ≤ 1.6, e_ours / e_HF ≤ 1.0). It scales with what the dtype and the
model's depth and logit range make unavoidable (bf16 on tiny random models gives e_HF ≈ 0.01–0.06 in
logprob and grows with depth), so one rule serves a 2-layer test model and a real checkpoint, while
a real mistake (a wrong RoPE layout, a missing bias, a misplaced norm, a wrong weight) moves
logprobs by far more than the rounding noise. A floor per dtype keeps the test meaningful when e_HF
is degenerate: 1e-4 (logprob) and 4e-5 (relative logits) in float32, 6–30× the reordering noise measured
on small dense fp32 models (1.4e-6–6.7e-6) and 3× the largest error of ours against the float64 run seen on
the hybrid test models (1.4e-5 relative logits: a Qwen3.5-MoE config of 150 tokens on an AMD EPYC host, where
transformers' own error was 8.5e-6, so ours is not always the more accurate there); 1e-2 and 2⁻⁸ (bf16's unit
roundoff) in bfloat16. Both e_HF and e_ours are
reported, so a run also shows directly whether ours is the more accurate of the two.

One error the reference cannot see: transformers builds its RoPE angles in float32 (inv_freq and
position · inv_freq) in every dtype, float64 included, while ours come from a float64 table. Their
cos/sin are off by about p·2⁻²⁴ at position p (4e-6 at 64, 1.4e-4 at 2048, 2e-3 at 32768), so at long
positions our measured error against the float64 run includes transformers' RoPE error; at the
default lengths here it is far below the float32 floor (2048 tokens: 3e-6 in logprob).
"""

import argparse
import contextlib
import json
import sys
from pathlib import Path

from .cli.errors import EXIT_INPUT_ERROR

DTYPES = ("float32", "bfloat16")
REFERENCE_DTYPE = {"float32": "float64", "bfloat16": "float32"}  # transformers one precision up
FLOORS = {"float32": {"max_abs_logprob": 1e-4, "max_rel_logit": 4e-5}, "bfloat16": {"max_abs_logprob": 1e-2, "max_rel_logit": 2**-8}}
NOISE_FACTOR = 2.0  # |ours − HF| ≤ e_ours + e_HF ≤ 2·e_HF when ours is no less accurate than HF


class ParityInputError(ValueError):
    """A comparison that cannot be run: bad directory, unsupported model, transformers missing."""


def sequence_lengths(num_sequences: int, seq_len: int) -> list[int]:
    """Distinct lengths from seq_len down, e.g. 3 × 48 -> [48, 32, 16]."""
    return [max(1, seq_len * (num_sequences - i) // num_sequences) for i in range(num_sequences)]


def compare(model_dir, dtype: str = "float32", *, contract: str | None = None, num_sequences: int = 3, seq_len: int = 48,
            seed: int = 0) -> dict:
    """Run our model and transformers' on the same checkpoint and random tokens; return the report
    (`passed` is whether every metric is within its tolerance). `contract`: a preset name, by default
    the model family's own. Raises ParityInputError on bad input."""
    import torch

    transformers = _import_transformers()
    if dtype not in DTYPES:
        raise ParityInputError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if num_sequences < 1 or seq_len < 1:
        raise ParityInputError(f"need at least one sequence of at least one token, got {num_sequences} × {seq_len}")
    if not Path(model_dir).is_dir():
        raise ParityInputError(f"{model_dir}: no such directory")
    ours = _load_ours(model_dir, dtype)
    spec = ours.spec
    if contract is None:
        from .model import family_of

        contract = family_of(spec).contract
    if seq_len > spec.max_position_embeddings:
        raise ParityInputError(f"seq_len {seq_len} exceeds the model's max_position_embeddings {spec.max_position_embeddings}")
    lengths = sequence_lengths(num_sequences, seq_len)
    tokens = torch.randint(spec.vocab_size, (sum(lengths),), generator=torch.Generator().manual_seed(seed))  # [T]

    our_logprobs, our_logits = _our_forward(ours, contract, lengths, tokens)
    del ours
    hf = _load_transformers(transformers, model_dir, dtype, spec.architecture)
    pinned = [name for name in TORCH_PATHS if hasattr(sys.modules[type(hf).__module__], name)]
    hf_logits = _hf_forward(hf, lengths, tokens)
    reference = REFERENCE_DTYPE[dtype]
    with _float32_as(hf, getattr(torch, reference)):
        exact_logits = _hf_forward(hf.to(getattr(torch, reference)), lengths, tokens).double()  # same weights, upcast exactly
    del hf

    hf_logprobs = hf_logits.log_softmax(-1)
    exact_logprobs = exact_logits.log_softmax(-1)
    diff = (our_logprobs - hf_logprobs).abs()  # [T, V]
    worst = int(diff.amax(-1).argmax())
    seq = next(b for b, end in enumerate(torch.tensor(lengths).cumsum(0).tolist()) if worst < end)
    measured = {"max_abs_logprob": float(diff.max()), "max_rel_logit": _max_rel(our_logits, hf_logits)}
    hf_error = {"max_abs_logprob": float((hf_logprobs.double() - exact_logprobs).abs().max()), "max_rel_logit": _max_rel(hf_logits.double(), exact_logits)}
    our_error = {"max_abs_logprob": float((our_logprobs.double() - exact_logprobs).abs().max()), "max_rel_logit": _max_rel(our_logits.double(), exact_logits)}
    tolerance = {k: max(FLOORS[dtype][k], NOISE_FACTOR * hf_error[k]) for k in measured}
    return {
        "model": str(model_dir),
        "architecture": spec.architecture,
        "dtype": dtype,
        "contract": contract,
        "seed": seed,
        "sequence_lengths": lengths,
        "vocab_size": spec.vocab_size,
        "measured": measured,
        "tolerance": tolerance,
        "passed": all(measured[k] <= tolerance[k] for k in measured),
        "worst_token": {"sequence": seq, "position": worst - sum(lengths[:seq])},
        "reference_dtype": reference,
        "hf_error": hf_error,
        "our_error": our_error,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "transformers_path": "torch (" + ", ".join(pinned) + " pinned to transformers' own)" if pinned else "torch",
    }


def _import_transformers():
    try:
        import transformers
    except ImportError:
        raise ParityInputError("parity needs Hugging Face transformers, which is not installed: pip install transformers") from None
    return transformers


def _load_ours(model_dir, dtype: str):
    from .model import SpecError, load

    try:
        return load(model_dir, dtype)
    except SpecError as error:
        raise ParityInputError(str(error)) from None


def _our_forward(model, contract_name: str, lengths: list[int], tokens):
    """Packed trainer_score forward -> (logprobs [T, V] float32, logits [T, V] float32)."""
    import torch

    from .contract import ContractError, fit_contract, load
    from .model import PackedBatch, Step, packed_state, step
    from .runtime.binding import bind

    try:
        ops = bind(fit_contract(load(contract_name), model.spec), model.spec, "trainer_score").ops["trainer_score"]
    except (ContractError, ValueError, KeyError) as error:
        raise ParityInputError(f"contract {contract_name}: cannot run {model.spec.architecture}: {error}") from None
    batch = PackedBatch.of(list(lengths), "cpu")
    with torch.no_grad(), step(Step(case="trainer_score", ops=ops, batch=batch, state=packed_state(model.spec))):
        hidden = model(tokens, batch.positions)  # [T, hidden]
        logits = ops["lm_head"](hidden, model.lm_head.weight)  # [T, V]
        return ops["logprobs"](logits), logits.float()


def _reason(error: Exception) -> str:
    """An exception's message on one line: its first line, and the next where the first only introduces it."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [type(error).__name__]
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]


def _load_transformers(transformers, model_dir, dtype: str, architecture: str):
    import torch

    verbosity, progress = transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        # transformers' own torch paths: eager attention, and the per-expert loop for MoE layers (its grouped_mm
        # kernel takes no float64, the reference precision of a float32 run).
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype), attn_implementation="eager",
                                                                  experts_implementation="eager")
    # Whatever transformers raises for a checkpoint it will not build (its config validators raise
    # huggingface_hub's own errors, not ValueError) is this input's problem: one line, no traceback.
    except Exception as error:  # noqa: BLE001
        raise ParityInputError(f"{model_dir}: transformers cannot load it: {_reason(error)}") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        if progress:
            transformers.utils.logging.enable_progress_bar()
    if type(model).__name__ != architecture:
        raise ParityInputError(f"{model_dir}: transformers loaded {type(model).__name__}, the config names {architecture}")
    _pin_torch_paths(model)
    return model.eval()


# transformers swaps flash-linear-attention's and causal-conv1d's kernels in for these functions of its
# Gated DeltaNet models when those packages import (hub_kernels.use_kernel_func_from_hub_with_fallback);
# the parity reference is transformers' own torch code.
TORCH_PATHS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update")


class _TorchWith:
    """torch, with `torch.float32` (and `torch.float`) standing for another dtype."""

    def __init__(self, dtype):
        self._dtype = dtype

    def __getattr__(self, name):
        import torch

        return self._dtype if name in ("float32", "float") else getattr(torch, name)


@contextlib.contextmanager
def _float32_as(model, dtype):
    """While the reference run lasts, the model's modeling module reads `torch.float32` as `dtype`: its
    explicit float32 casts (Gated DeltaNet's delta rule and conv, RMSNorm's) then keep the reference's
    precision instead of rounding a float64 run to float32. (`Tensor.float()` calls still round.)"""
    import torch

    module = sys.modules[type(model).__module__]
    if dtype != torch.float64 or getattr(module, "torch", None) is not torch:
        yield
        return
    module.torch = _TorchWith(dtype)
    try:
        yield
    finally:
        module.torch = torch


def _pin_torch_paths(model) -> list[str]:
    """Rebind the model's modeling module to transformers' torch functions; -> the names rebound."""
    import inspect

    module = sys.modules[type(model).__module__]
    pinned = []
    for name in TORCH_PATHS:
        if hasattr(module, name):
            setattr(module, name, inspect.unwrap(getattr(module, name)))
            pinned.append(name)
    return pinned


def _hf_forward(model, lengths: list[int], tokens):
    """One sequence at a time, positions from 0 -> logits [T, V] float32 (or float64 in float64)."""
    import torch

    rows, start = [], 0
    with torch.no_grad():
        for length in lengths:
            ids = tokens[start : start + length][None]  # [1, L]
            out = model(input_ids=ids, position_ids=torch.arange(length)[None], use_cache=False)
            rows.append(out.logits[0].to(torch.promote_types(out.logits.dtype, torch.float32)))
            start += length
    return torch.cat(rows)


def _max_rel(logits, reference) -> float:
    """‖Δ‖ / ‖reference‖ per row, max over rows."""
    return float(((logits - reference).norm(dim=-1) / reference.norm(dim=-1)).max())


def render(report: dict) -> str:
    lengths = ", ".join(map(str, report["sequence_lengths"]))
    lines = [
        f"parity {report['model']}: {report['architecture']} in {report['dtype']} vs transformers {report['versions']['transformers']} "
        f"(sequences of {lengths} tokens, contract {report['contract']})",
        f"  {'':<22} {'ours vs HF':>11} {'tolerance':>11} {'HF error':>11} {'our error':>11}",
    ]
    labels = {"max_abs_logprob": "max |Δ logprob|", "max_rel_logit": "max rel. logit error"}
    for key, label in labels.items():
        lines.append(f"  {label:<22} {report['measured'][key]:>11.3e} {report['tolerance'][key]:>11.3e} "
                     f"{report['hf_error'][key]:>11.3e} {report['our_error'][key]:>11.3e}")
    lines.append(f"  (errors against transformers in {report['reference_dtype']}; tolerance = max(floor, {NOISE_FACTOR:g} × HF error))")
    if report.get("transformers_path", "torch") != "torch":
        lines.append(f"  (transformers ran {report['transformers_path']})")
    lines.append("PASS" if report["passed"] else
                 f"FAIL (worst token: sequence {report['worst_token']['sequence']}, position {report['worst_token']['position']})")
    return "\n".join(lines)


def _run(args) -> int:
    try:
        report = compare(args.model, args.dtype)
        print(render(report))
        if args.json:
            try:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n", "utf-8")
            except OSError as error:
                raise ParityInputError(f"--json {args.json}: {error.strerror or error}") from None
    except ParityInputError as error:
        print(f"isoexec: error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    return 0 if report["passed"] else 1


def add_parser(commands) -> argparse.ArgumentParser:
    """Register `isoexec parity` on the CLI's subparsers object."""
    parity = commands.add_parser(
        "parity",
        help="compare the model with Hugging Face transformers on the same weights",
        description="Load a checkpoint directory into IsoExec's model and into transformers' own implementation "
        "(eager attention), run both on the same random token sequences, and compare full-vocabulary "
        "log-probabilities and logits. The tolerance is twice transformers' own rounding error against itself run "
        "one precision up. Needs transformers (pip install transformers). Exit status: 0 within tolerance, "
        "1 outside, 2 on bad input.",
    )
    parity.add_argument("--model", required=True, metavar="DIR", help="a checkpoint directory (config.json + *.safetensors)")
    parity.add_argument("--dtype", default="float32", choices=DTYPES, help="the dtype both models run in (default: float32)")
    parity.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parity.set_defaults(run=_run)
    return parity
