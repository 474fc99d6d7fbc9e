"""Output files written whole: whenever a run stops (done, failed, Ctrl-C), a reader finds the previous
complete output or the new one, never a torn file or new files beside old ones.

A file is written under a temporary name in its own folder (the same file system) and renamed into
place, as checkpoints are (`checkpoint.py`); a folder of outputs is written into a temporary folder
whose files are moved in once all of them are written.
"""

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator


def write_text(path, text: str) -> None:
    """`path` holds `text`, or is left as it was when writing fails or is interrupted."""
    if Path(path).exists() and not Path(path).is_file():  # /dev/stdout, a pipe: nothing on disk to tear or replace
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return
    path = Path(os.path.realpath(path))  # through a symlink: the file it names is replaced, not the link
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o644)  # mkstemp makes 0600; these are ordinary files
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def staged_folder(out) -> Iterator[Path]:
    """A fresh temporary folder to write the outputs of folder `out` into. When the block completes its
    files replace those of the same names in `out`; when the block raises (Ctrl-C included) it is
    deleted and `out` is left untouched."""
    out = Path(out)
    inside = out.is_dir()
    if inside:  # inside `out` (so `--out .` works), its files renamed into place one by one
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=out))
    else:  # beside `out`, renamed to it whole
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        os.chmod(staging, 0o755)  # mkdtemp makes 0700; this becomes an ordinary output folder
    try:
        yield staging
        if not inside:
            os.replace(staging, out)
            return
        # Back to back: the window in which `out` holds old and new files is a few system calls.
        for path in sorted(staging.iterdir()):
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def warn(message: str) -> None:
    """One line on stderr, the way the CLI prints what it did on the user's behalf."""
    print(f"isoexec: warning: {message}", file=sys.stderr, flush=True)
