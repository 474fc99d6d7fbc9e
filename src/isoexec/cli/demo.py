"""`isoexec demo`: RL on a tiny model (or a checkpoint) under the contract and under native, side by side."""

import json
import sys
from pathlib import Path

from .common import add_command, add_json_file_flag, add_quiet_flag, check_output_path, check_rl_inputs, rl_config
from .errors import EXIT_MISMATCH, EXIT_OK, input_error


def add_parser(commands):
    from ..rl.config import add_config_flags

    demo = add_command(
        commands,
        "demo",
        run,
        help="train a tiny model (or your checkpoint) with RL under the contract and under native, side by side",
        description="Warm up a tiny model on an embedded verifiable task (or start from your Hugging Face checkpoint "
        "with --model: its own tokenizer and chat template, in float32), then run the same GRPO/DAPO training under "
        "the IsoExec contract and under the native fast path. Every step's trainer log-probs are compared with the "
        "rollout's: under the contract any difference stops the run (the gate); under native it is measured. Prints "
        "a per-step table and a summary, writes log.jsonl, plot.png and summary.json (together, once both paths are "
        "done). Exit status: 0 when the contract path saw zero mismatch on every step, 1 otherwise, 2 on bad input, "
        "130 when interrupted.",
    )
    add_config_flags(demo)
    demo.add_argument("--out", default="isoexec-demo", metavar="DIR", help="where to write log.jsonl, plot.png, summary.json (default: isoexec-demo)")
    add_json_file_flag(demo, "summary")
    add_quiet_flag(demo)
    return demo


def run(args) -> int:
    from ..model import SpecError
    from ..rl import outputs
    from ..rl.demo import demo
    from ..rl.gate import GateError
    from ..rl.handshake import AdmissionError

    config = rl_config(args)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise input_error(f"--out {args.out} is not a directory")
    check_output_path("--json", args.json)
    check_rl_inputs(config, warn=outputs.warn)
    try:
        summary = demo(config, out_dir=args.out, progress=not args.quiet)
        if args.json:
            outputs.write_text(args.json, json.dumps(summary, indent=2))
    except GateError as error:
        print(f"isoexec: {error}", file=sys.stderr)
        return EXIT_MISMATCH
    except (AdmissionError, SpecError) as error:  # SpecError: --model's weights unreadable
        raise input_error(error) from None
    except OSError as error:
        raise input_error(f"{error.filename}: {error.strerror}" if error.filename else error) from None
    return EXIT_OK if summary["contract"]["steps_with_mismatch"] == 0 else EXIT_MISMATCH
