"""gdn.core under a contract (default tiny-hybrid-triton) at Qwen3.5's GDN head shapes: the outputs of one packed
batch of sequences as a trainer call computes them, as one prefill through the engine's cache, as prefill
chunks of 37 tokens and as prefill then one-token decode steps, each form's sha-256 (of the bf16 bits) and
whether it equals the first form's bit for bit, by each path of gdn.core.triton (one launch, or two:
`TWO_LAUNCH_MIN_RUN`, `WALK_BLOCK_V`, `WALK_PREFETCH`); then the training forward's and a prefill's time by each path and by
flash-linear-attention where it imports.

    cd benchmarks && PYTHONPATH=../src:. python3 gdn_bits.py [--json FILE] [--small]

Run from two trees, the digests say whether a change kept the bits."""

import argparse
import hashlib
import json

import torch

from gdn import SHAPES, SMALL_SHAPES, _cache, _contract_op, _fla, _fla_chunk, _inputs
from timing import device_name, kernel_ms

LENGTHS = (77, 300, 2048, 16, 15, 1, 33, 1000)
PIECE, DECODED = 37, 40


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]


def _engine(op, x, shape, chunk, width, lengths, calls, device) -> torch.Tensor:
    """Rows of every sequence through one cache, `calls` a list of [(seq, start, stop)], in packed order."""
    hk, hv, dk, dv = shape
    width = width(hv, dk, dv)
    state = torch.full((len(lengths), hv, dk, dv), float("nan"), device=device)
    rows = torch.full((len(lengths), chunk, hv, width), float("nan"), device=device)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    out = torch.full((starts[-1], hv, dv), float("nan"), dtype=torch.bfloat16, device=device)
    for spans in calls:
        index = torch.cat([torch.arange(starts[s] + a, starts[s] + b, device=device) for s, a, b in spans])
        ids = torch.cat([torch.full((b - a,), s, device=device) for s, a, b in spans])
        positions = torch.cat([torch.arange(a, b, device=device) for s, a, b in spans])
        y = op(*(x[n][index] for n in "qkvab"), x["a_log"], x["dt_bias"], state, rows, ids, positions)
        out[index] = y
    return out


# gdn.core.triton's paths: (TWO_LAUNCH_MIN_RUN, WALK_BLOCK_V, WALK_PREFETCH); a tree without them has the one launch alone.
SETTINGS = {"one launch": (None, None, False), "two launches": (1, None, False), "two launches, walk of 64": (1, 64, False),
            "two launches, walk of 64, prefetched": (1, 64, True), "two launches, walk of 32, prefetched": (1, 32, True)}


def _settings(module) -> dict:
    return SETTINGS if hasattr(module, "TWO_LAUNCH_MIN_RUN") else {"one launch": SETTINGS["one launch"]}


def _set(module, setting) -> None:
    if hasattr(module, "TWO_LAUNCH_MIN_RUN"):
        module.TWO_LAUNCH_MIN_RUN, module.WALK_BLOCK_V, module.WALK_PREFETCH = setting
    if hasattr(module, "TWO_LAUNCH_MAX_FILL"):  # every call of the two-launch settings in two launches, however many programs
        module.TWO_LAUNCH_MAX_FILL = None
    if hasattr(module, "WALK_NARROW"):  # the walk in the setting's block, however many programs
        module.WALK_NARROW = ()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contract", default="tiny-hybrid-triton")
    parser.add_argument("--json")
    parser.add_argument("--small", action="store_true", help="tiny heads and sequences (the CPU, Triton's interpreter)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from isoexec.ops.gdn import triton as gdn_triton

    shapes, lengths, training, context = SHAPES, LENGTHS, ((8, 2048), (2, 4096)), 2048
    if args.small:
        shapes, lengths, training, context = SMALL_SHAPES, (7, 30, 50, 1, 17), ((2, 40),), 32

    op, entry, width = _contract_op(args.contract)
    chunk = dict(entry.constants)["chunk_size"]
    fla, _ = _fla()
    settings = _settings(gdn_triton)
    report = dict(device=device_name(device), contract=args.contract, forms={}, times={})
    for name, shape in shapes.items():
        g = torch.Generator(device=device).manual_seed(0)
        x = _inputs(shape, sum(lengths), device, g)
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        forms = {}
        with torch.no_grad():
            for label, setting in settings.items():
                _set(gdn_triton, setting)
                forms[f"trainer ({label})"] = op(*(x[n] for n in "qkvab"), x["a_log"], x["dt_bias"], None, None, None, positions)
                forms[f"prefill ({label})"] = _engine(op, x, shape, chunk, width, lengths, [[(s, 0, n) for s, n in enumerate(lengths)]], device)
                pieces = [[(s, a, min(n, a + PIECE)) for s, n in enumerate(lengths) if a < n] for a in range(0, max(lengths), PIECE)]
                forms[f"prefill in pieces of {PIECE} ({label})"] = _engine(op, x, shape, chunk, width, lengths, pieces, device)
                steps = [[(s, 0, n - DECODED) for s, n in enumerate(lengths) if n > DECODED]]
                steps += [[(s, p, p + 1) for s, n in enumerate(lengths) if max(0, n - DECODED) <= p < n] for p in range(max(lengths))]
                forms[f"prefill, then {DECODED} decode steps ({label})"] = _engine(op, x, shape, chunk, width, lengths, [c for c in steps if c],
                                                                                   device)
            _set(gdn_triton, SETTINGS["one launch"])
        first = next(iter(forms.values()))
        rows = {form: dict(sha256=_digest(y), equal=bool(torch.equal(y.view(torch.int16), first.view(torch.int16)))) for form, y in forms.items()}
        report["forms"][name] = rows
        for form, row in rows.items():
            print(f"{name:16s} {form:48s} {row['sha256']}  {'same bits' if row['equal'] else 'DIFFERENT'}", flush=True)
        cases = [("training forward", n, l, 0) for n, l in training] + [(f"prefill after {context}", 1, l, context) for l in (context, context // 4)]
        for phase, num_seqs, seq_len, start in cases:
            xt = _inputs(shape, num_seqs * seq_len, device, g)
            pos = torch.arange(start, start + seq_len, device=device).repeat(num_seqs)
            cu = torch.arange(num_seqs + 1, device=device, dtype=torch.int32) * seq_len
            state, cache_rows = _cache(shape, num_seqs, chunk, width(shape[1], shape[2], shape[3]), device, g)
            ids = torch.arange(num_seqs, device=device).repeat_interleave(seq_len)
            cache = (state, cache_rows, ids) if start else (None, None, None)
            times = {}
            with torch.no_grad():
                for label, setting in settings.items():
                    _set(gdn_triton, setting)
                    times[label] = kernel_ms(lambda: op(*(xt[n] for n in "qkvab"), xt["a_log"], xt["dt_bias"], *cache, pos), device)
                _set(gdn_triton, SETTINGS["one launch"])
                if fla is not None:
                    initial = state if start else None
                    times["fla"] = kernel_ms(lambda: _fla_chunk(fla, xt, cu, initial), device)
            report["times"][f"{name} {phase} {num_seqs}x{seq_len}"] = times
            print(f"{name:16s} {phase} {num_seqs} x {seq_len}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
