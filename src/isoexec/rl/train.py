"""`isoexec train`: the RL loop run up to `steps`, resumed from its checkpoint folder when one is there.

A run killed at any point and started again with the same config continues from its newest
checkpoint and ends bitwise identical to one never interrupted (given the same torch thread count).
torch and the loop are imported when a run starts, not when the CLI registers the command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from typing import TYPE_CHECKING

from .config import RLConfig, add_config_flags, config_from_args

if TYPE_CHECKING:
    from .loop import RLRun


def train(config: RLConfig, *, progress: bool = True, log_jsonl: str | None = None) -> RLRun:
    """Run to `config.steps`, resuming from `config.checkpoint_dir` when it holds a checkpoint.

    `log_jsonl` gets one JSON line of metrics per step; it is rewritten from the run's history on
    every start, so a resumed run's log has each step exactly once.
    """
    import torch
    from tqdm.auto import tqdm

    from . import checkpoint
    from .loop import RLRun

    directory = config.checkpoint_dir
    run = checkpoint.restore(config, directory) if directory else None
    if run is None:
        # The loop draws only from (seed, step); the global generators are seeded too (torch seeds its
        # own differently in every process) so that whatever else draws is reproducible and resumable.
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        run = RLRun(config)
        if directory:
            checkpoint.save(run, directory)  # a kill during the first step does not redo the warm-up
    elif run.step > config.steps:
        raise checkpoint.CheckpointError(f"the checkpoint in {directory} is at step {run.step}, past steps={config.steps}")
    elif progress:
        print(f"resuming from {directory} at step {run.step} of {config.steps}", file=sys.stderr)
    with open(log_jsonl, "w", encoding="utf-8") if log_jsonl else contextlib.nullcontext() as log, \
            tqdm(total=config.steps, initial=run.step, disable=not progress, desc="train", unit="step") as bar:
        if log:
            log.writelines(json.dumps(metrics) + "\n" for metrics in run.history)
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


def add_parser(commands) -> argparse.ArgumentParser:
    """Register `isoexec train` on the CLI's subparsers object: one flag per RLConfig field, and the outputs."""
    parser = commands.add_parser(
        "train",
        help="run on-policy RL (GRPO/DAPO) with a bitwise gate, resuming from its checkpoints",
        description="Warm up a tiny policy on a task's answers, then run GRPO or DAPO: roll out in the engine, "
        "recompute log-probs in the trainer, gate them bit for bit under the contract, update, and send the weights "
        "to the engine with digests checked on both sides. With --checkpoint-dir, a killed run started again with "
        "the same flags resumes and ends bitwise identical to an uninterrupted one (at the same torch thread count). "
        "Exit status: 0 when every step passed, 1 when the gate stopped a step, 2 on bad input.",
    )
    add_config_flags(parser)
    parser.add_argument("--json", metavar="FILE", help="also write the last step's metrics as JSON to FILE")
    parser.add_argument("--log", metavar="FILE", help="write every step's metrics to FILE, one JSON object a line")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=_run)
    return parser


def _run(args) -> int:
    from ..contract import ContractError
    from . import checkpoint
    from .gate import GateError
    from .tasks import load_task

    try:
        config = config_from_args(args)
        load_task(config.task, config.data)  # a malformed data file is bad input too, found before the warm-up
    except ValueError as error:
        raise ContractError("", str(error)) from None
    try:
        run = train(config, progress=not args.quiet, log_jsonl=args.log)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump(run.history[-1], out, indent=2)
    except checkpoint.CheckpointError as error:
        raise ContractError("", str(error)) from None
    except OSError as error:
        raise ContractError("", f"{error.filename}: {error.strerror}" if error.filename else str(error)) from None
    except GateError as error:
        where = f"; the newest checkpoint is in {config.checkpoint_dir}" if config.checkpoint_dir else ""
        print(f"isoexec: {error}{where}", file=sys.stderr)
        return 1
    last = run.history[-1]
    print(f"step {run.step}: reward {last['reward']:.3f}, accuracy {last['accuracy']:.3f}, weights {run.weights}")
    return 0
