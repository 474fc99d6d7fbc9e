"""Run by test_commands.py in a process of its own: `python commands.py PLAN` runs each `isoexec` command line of a
plan (a JSON list of {"args", "out"}) in turn through the console entry's `main`, in this one process, and writes
its exit code, standard output and standard error as JSON at its `out`: vLLM's import, most of a small audit's
time on a CPU, is paid once. A command that raises writes its traceback as its standard error, exit code 1."""
import contextlib
import io
import json
import sys
import traceback

from isoexec.cli import main


def run(plan: list[dict]) -> None:
    for item in plan:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                returncode = main(item["args"])
            except SystemExit as exit:  # argparse's own refusals
                returncode = exit.code
            except Exception:  # noqa: BLE001 (the test reads it)
                returncode = 1
                traceback.print_exc()
        with open(item["out"], "w") as f:
            json.dump({"returncode": returncode, "stdout": out.getvalue(), "stderr": err.getvalue()}, f)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        run(json.load(f))
