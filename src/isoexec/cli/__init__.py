"""The `isoexec` command line: the argparse root, `main` and its exit statuses.

One module per command, each with `add_parser(subparsers)` (its flags and help) and `run(args) -> int`:
`contract` (show, hash, diff), `validate`, `fingerprint`, `audit`, `demo` here; `train` in
`isoexec.rl.train` and `parity` in `isoexec.parity`. What they share is in `errors` (exit statuses,
the one-line input error) and `common` (checks before any work, the --model spec, common flags).
torch and the model are imported inside the commands' `run`, so that `isoexec --help` and
`isoexec contract …` answer without them.
"""

import sys

from ..env import EnvError
from . import audit, contract, demo, fingerprint, validate
from .common import check_output_path, check_rl_inputs, check_runnable, model_spec, require_device
from .errors import EXIT_INPUT_ERROR, EXIT_INTERRUPTED, EXIT_MISMATCH, EXIT_OK, ContractError, _Parser, input_error

__all__ = [
    "EXIT_INPUT_ERROR", "EXIT_INTERRUPTED", "EXIT_MISMATCH", "EXIT_OK", "build_parser", "check_output_path",
    "check_rl_inputs", "check_runnable", "input_error", "main", "model_spec", "require_device",
]


def build_parser() -> _Parser:
    parser = _Parser(
        prog="isoexec",
        description="Bitwise identical token log-probabilities between an RL trainer and its rollout engine.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    from ..parity import add_parser as add_parity
    from ..rl.train import add_parser as add_train

    for add_parser in (contract.add_parser, validate.add_parser, fingerprint.add_parser, audit.add_parser, demo.add_parser,
                       add_train, add_parity):
        add_parser(commands)
    return parser


def _is_spec_error(error: Exception) -> bool:
    """A model config the code cannot run (`model.SpecError`), looked up only once one is raised: the
    model package imports torch, which `isoexec --help` should not wait for."""
    from ..model.spec import SpecError

    return isinstance(error, SpecError)


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except ContractError as error:
        print(f"isoexec: error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except ValueError as error:
        if not (isinstance(error, EnvError) or _is_spec_error(error)):
            raise
        print(f"isoexec: error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        print("isoexec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        sys.stderr.close()
        return EXIT_OK
