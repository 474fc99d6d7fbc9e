"""`isoexec demo`: the same RL run under the IsoExec contract and under the native fast path.

Both paths start from one policy (the warmed-up toy, or a checkpoint's weights) with one seed; each
step's table row, a JSONL log and a PNG plot show reward and rollout/trainer mismatch side by side, and
the summary states what was measured: zero mismatch on every step under the contract, the mismatch
under native, the reward gain, and the contract's step-time overhead.
"""

import copy
import errno
import functools
import json
import statistics
from pathlib import Path

from tqdm.auto import tqdm

from .config import RLConfig
from .loop import initial_model, setup, start_lines
from .parallel_mode import start_run
from .outputs import staged_folder
from .plot import write_plot
from .warmup import warmup

COLUMNS = ("path", "step", "reward", "accuracy", "|Δ| mean", "|Δ| max", "bitwise", "k3 KL", "time s")


def _row(path: str, m: dict) -> str:
    compared = "tokens" in m
    cells = (path, m["step"], f"{m['reward']:.3f}", f"{m['accuracy']:.3f}",
             f"{m['rollout_train_logprob_abs_diff_mean']:.2e}" if compared else "-",
             f"{m['rollout_train_logprob_abs_diff_max']:.2e}" if compared else "-",
             f"{m['bitwise_equal_fraction']:.3f}" if compared else "-", f"{m['k3_kl']:.1e}" if compared else "-", f"{m['step_seconds']:.3f}")
    return "  ".join(f"{c!s:>9}" for c in cells)


def summarize(histories: dict[str, list[dict]]) -> dict:
    out = {}
    for path, history in histories.items():
        compared = [m for m in history if "tokens" in m]
        window = max(1, min(5, len(history) // 2))
        first = statistics.fmean(m["accuracy"] for m in history[:window])
        last = statistics.fmean(m["accuracy"] for m in history[-window:])
        out[path] = {
            "steps": len(history),
            "steps_compared": len(compared),
            "tokens_compared": sum(m["tokens"] for m in compared),
            "steps_with_mismatch": sum(1 for m in compared if m["bitwise_equal_fraction"] < 1 or m["full_vocab_rows_bitwise_equal_fraction"] < 1),
            "rollout_train_logprob_abs_diff_max": max((m["rollout_train_logprob_abs_diff_max"] for m in compared), default=0.0),
            "k3_kl_mean": statistics.fmean(m["k3_kl"] for m in compared) if compared else 0.0,
            "accuracy_first": first,
            "accuracy_last": last,
            "accuracy_gain": last - first,
            "median_step_seconds": statistics.median(m["step_seconds"] for m in history),
        }
    if "contract" in out and "native" in out:
        out["overhead"] = out["contract"]["median_step_seconds"] / out["native"]["median_step_seconds"] - 1
    return out


def render_summary(summary: dict) -> str:
    c, n = summary["contract"], summary["native"]
    return "\n".join([
        f"contract: {c['steps_with_mismatch']} of {c['steps_compared']} trained steps had any mismatch "
        f"({c['tokens_compared']} tokens and their full-vocab rows compared bit for bit); max |Δlogp| {c['rollout_train_logprob_abs_diff_max']:.3g}",
        f"native:   {n['steps_with_mismatch']} of {n['steps_compared']} trained steps had a mismatch; "
        f"max |Δlogp| {n['rollout_train_logprob_abs_diff_max']:.3g}, mean k3 KL {n['k3_kl_mean']:.3g}",
        f"accuracy: contract {c['accuracy_first']:.3f} → {c['accuracy_last']:.3f} ({c['accuracy_gain']:+.3f}), "
        f"native {n['accuracy_first']:.3f} → {n['accuracy_last']:.3f} ({n['accuracy_gain']:+.3f})",
        f"overhead: contract median step {c['median_step_seconds'] * 1e3:.0f} ms vs native {n['median_step_seconds'] * 1e3:.0f} ms "
        f"({summary['overhead']:+.0%}, CPU reference kernels; GPU figures live in benchmarks/RESULTS.md)",
    ])


def demo(config: RLConfig, *, out_dir: str | Path = "isoexec-demo", progress: bool = True, echo=None) -> dict:
    """Run both paths; write log.jsonl, plot.png and summary.json into `out_dir`; return the summary.

    The three files appear in `out_dir` together when both paths have finished: a run that fails or is
    interrupted leaves the folder as it was (outputs.py).
    """
    echo = echo or functools.partial(print, flush=True)  # lines as they happen, also through a pipe
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(out))
    task, spec, _ = setup(config)
    with staged_folder(out) as staging:
        for line in start_lines(config, task):
            echo(line)
        initial = warmup(initial_model(config, spec), task, config)
        histories, layouts = _run_paths(config, initial, staging / "log.jsonl", progress, echo)
        write_plot(staging / "plot.png", histories)
        summary = {"config": {k: v for k, v in vars(config).items()}, "layout": layouts["contract"], **summarize(histories)}
        (staging / "summary.json").write_text(json.dumps(summary, indent=2), "utf-8")
    echo(render_summary(summary))
    echo(f"wrote {out / 'log.jsonl'}, {out / 'plot.png'}, {out / 'summary.json'}")
    return summary


def _run_paths(config: RLConfig, initial, log_path: Path, progress: bool, echo) -> tuple[dict, dict]:
    """The contract path, then the native one, each from a copy of `initial`; every step logged and shown. Returns
    each path's history and its sides' layouts."""
    paths = {"contract": config, "native": config.replace(contract="native", checkpoint_dir=None)}
    histories, layouts = {}, {}
    echo("  ".join(f"{c:>9}" for c in COLUMNS))
    with open(log_path, "w", encoding="utf-8") as log, tqdm(total=2 * config.steps, disable=not progress, desc="demo", unit="step") as bar:
        for path, path_config in paths.items():
            run = start_run(path_config, initial=copy.deepcopy(initial))
            try:
                for _ in range(config.steps):
                    metrics = run.run_step()
                    log.write(json.dumps({"path": path, **metrics}) + "\n")
                    log.flush()
                    bar.write(_row(path, metrics)) if progress else echo(_row(path, metrics))
                    bar.update()
            finally:
                run.close()
            histories[path] = run.history
            layouts[path] = run.layout
    return histories, layouts
