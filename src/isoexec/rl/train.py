"""`isoexec train`: the RL loop run up to `steps`, resumed from its checkpoint folder when one is there.

A run killed at any point and started again with the same config continues from its newest intact
checkpoint and ends bitwise identical to one never interrupted (given the same torch thread count).
torch and the loop are imported when a run starts, not when the CLI registers the command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .config import RLConfig, add_config_flags, config_from_args

if TYPE_CHECKING:
    from .loop import RLRun


def train(config: RLConfig, *, progress: bool = True, log_jsonl: str | None = None, warn=None) -> RLRun:
    """Run to `config.steps`, resuming from the newest intact checkpoint in `config.checkpoint_dir`.

    `log_jsonl` gets one JSON line of metrics per step as the run goes; it is rewritten from the run's
    history on every start (in one rename), so a resumed run's log has each step exactly once. `warn`
    gets one line per checkpoint skipped as unreadable (default: printed to stderr).
    """
    import torch
    from tqdm.auto import tqdm

    from . import checkpoint, outputs
    from .loop import start_lines, task_and_spec
    from .parallel_mode import start_run

    directory = config.checkpoint_dir
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails before the warm-up
    run = checkpoint.restore(config, directory, warn=warn or outputs.warn) if directory else None
    if run is None:
        for line in start_lines(config, task_and_spec(config)[0]) if progress else ():
            print(line, file=sys.stderr, flush=True)
        # The loop draws only from (seed, step); the global generators are seeded too (torch seeds its
        # own differently in every process) so that whatever else draws is reproducible and resumable.
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        run = start_run(config)
        if directory:
            checkpoint.save(run, directory)  # a kill during the first step does not redo the warm-up
    elif run.step > config.steps:
        raise checkpoint.CheckpointError(f"the checkpoint in {directory} is at step {run.step}, past steps={config.steps}")
    elif progress:
        print(f"resuming from {directory} at step {run.step} of {config.steps}", file=sys.stderr, flush=True)
    if log_jsonl:  # whole, so that a run stopped now leaves a log of every step its checkpoint holds
        outputs.write_text(log_jsonl, "".join(json.dumps(metrics) + "\n" for metrics in run.history))
    with open(log_jsonl, "a", encoding="utf-8") if log_jsonl else contextlib.nullcontext() as log, contextlib.closing(run), \
            tqdm(total=config.steps, initial=run.step, disable=not progress, desc="train", unit="step") as bar:
        while run.step < config.steps:
            metrics = run.run_step()
            if log:
                log.write(json.dumps(metrics) + "\n")
                log.flush()
            if directory and (run.step % config.checkpoint_every == 0 or run.step == config.steps):
                checkpoint.save(run, directory)
            bar.set_postfix(reward=f"{metrics['reward']:.3f}", accuracy=f"{metrics['accuracy']:.2f}", refresh=False)
            bar.update()
    return run


def summary_line(run: RLRun) -> str:
    """The last line `isoexec train` prints: its step number is the one in the metrics (and --json)."""
    last = run.history[-1]
    steps = f"{run.step} step{'s' if run.step != 1 else ''}"
    return (f"trained {steps} (numbered from 0); step {last['step']}: reward {last['reward']:.3f}, "
            f"accuracy {last['accuracy']:.3f}, weights {run.weights}")


def add_parser(commands) -> argparse.ArgumentParser:
    """Register `isoexec train` on the CLI's subparsers object: one flag per RLConfig field, and the outputs."""
    parser = commands.add_parser(
        "train",
        help="run on-policy RL (GRPO/DAPO) with a bitwise gate, resuming from its checkpoints",
        description="Warm up a tiny policy on a task's answers (or start from your Hugging Face checkpoint with --model, "
        "its own tokenizer and chat template; float32 on a CPU, bfloat16 with float32 master weights on a GPU), then run GRPO or DAPO: roll out in the engine, "
        "recompute log-probs in the trainer, gate them bit for bit under the contract, update, and send the weights "
        "to the engine with digests checked on both sides. With --checkpoint-dir, a killed run started again with "
        "the same flags resumes and ends bitwise identical to an uninterrupted one (at the same torch thread count). "
        "Exit status: 0 when every step passed, 1 when the gate stopped a step, 2 on bad input, 130 when "
        "interrupted.",
    )
    add_config_flags(parser)
    parser.add_argument("--json", metavar="FILE", help="also write the last step's metrics as JSON to FILE")
    parser.add_argument("--log", metavar="FILE", help="write every step's metrics to FILE, one JSON object a line")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=_run)
    return parser


def _run(args) -> int:
    from ..cli import EXIT_MISMATCH, EXIT_OK, check_output_path, check_rl_inputs, input_error
    from ..model import SpecError
    from . import checkpoint, outputs
    from .gate import GateError
    from .handshake import AdmissionError
    from ..runtime.handshake import HandshakeRefused
    from ..vllm.errors import VllmEngineError

    try:
        config = config_from_args(args)
    except ValueError as error:
        raise input_error(error) from None
    check_output_path("--json", args.json)
    check_output_path("--log", args.log)
    check_rl_inputs(config, warn=outputs.warn)  # the data, the contract on this machine: before the warm-up
    try:
        run = train(config, progress=not args.quiet, log_jsonl=args.log, warn=outputs.warn)
        if args.json:
            outputs.write_text(args.json, json.dumps(run.history[-1] | {"layout": run.layout}, indent=2))
    except (checkpoint.CheckpointError, AdmissionError, SpecError, VllmEngineError) as error:  # SpecError: --model's weights unreadable
        raise input_error(error) from None
    except HandshakeRefused as error:  # the engine does not run what the trainer runs: the readable diff, no traceback
        print(error, file=sys.stderr)
        return EXIT_MISMATCH
    except OSError as error:
        raise input_error(f"{error.filename}: {error.strerror}" if error.filename else error) from None
    except GateError as error:
        where = f"; the newest checkpoint is in {config.checkpoint_dir}" if config.checkpoint_dir else ""
        print(f"isoexec: {error}{where}", file=sys.stderr)
        return EXIT_MISMATCH
    print(summary_line(run))
    return EXIT_OK
