"""Exit statuses, the same for every command, and the one-line input error.

Light on purpose: neither torch nor the model is imported here, so that every command module (and
`isoexec.parity`) takes its exit statuses from this one place without loading either.
"""

import argparse

from ..contract import ContractError

EXIT_OK = 0
EXIT_MISMATCH = 1  # the gate stopped a run (train, demo), a mismatch under a bitwise contract (audit),
#                    a rejected kernel (validate), different numerical policies (contract diff)
EXIT_INPUT_ERROR = 2  # bad input, said in one line on stderr
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a process the signal ended


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(EXIT_INPUT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def input_error(problem) -> ContractError:
    """The exception `main` turns into `isoexec: error: <problem>` and exit status 2."""
    return ContractError("", str(problem))
