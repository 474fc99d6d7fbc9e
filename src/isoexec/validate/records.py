"""Admission records: what the battery proved, for which impl, constants, source, library and device.

A record is one JSON file under `$ISOEXEC_HOME/admissions/` (default `~/.cache/isoexec`), named by the
SHA-256 of everything that could change the impl's bits. The runtime fingerprint looks records up, so
an impl counts as admitted only on the exact code, constants, torch/triton and device it was proven on,
and for the model geometry the probes ran at (`validate.geometry_of`: empty when validated without a
model): kernels pick instructions and loop shapes by head_dim and K, and an H200 showed entries that
agreed at the probes' own small shapes and disagreed at a model's (docs/validate.md).
"""

import contextlib
import datetime
import fcntl
import json
import os
import tempfile
from pathlib import Path

from ..contract.identity import canonical_json, sha256_id


def records_dir() -> Path:
    return Path(os.environ.get("ISOEXEC_HOME", "~/.cache/isoexec")).expanduser() / "admissions"


def _key(impl_ref: str, constants: dict, source_sha256: str | None, runtime: dict, geometry: dict | None) -> dict:
    device = runtime["device"]
    return {
        "impl": impl_ref,
        "constants": constants,
        "source_sha256": source_sha256,
        "torch": runtime["torch"],
        "triton": runtime["triton"],
        "device": {k: device.get(k) for k in ("type", "arch", "isa")},
        "geometry": dict(geometry or {}),
    }


def _path(key: dict) -> Path:
    return records_dir() / (sha256_id(key).removeprefix("sha256:") + ".json")


@contextlib.contextmanager
def _locked(folder: Path):
    """Exclusive lock on the records folder: merging cases is read-modify-write, and a trainer and an
    engine on one host may record at the same moment."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write(impl, constants: dict, runtime: dict, *, cases: list[str], status: str, dtypes: list[str], trials: int, failures: list[str],
          geometry: dict | None = None) -> Path:
    key = _key(impl.ref, constants, impl.source_sha256, runtime, geometry)
    path = _path(key)
    with _locked(path.parent):
        if status == "admitted":  # entries that split one impl's cases each prove their own
            previous = lookup(impl, constants, runtime, geometry)
            if previous and previous.get("status") == "admitted":
                cases = sorted(set(cases) | set(previous["cases_proven"]))
        record = {
            **key,
            "region": impl.region,
            "device": runtime["device"],
            "cases_proven": sorted(cases) if status == "admitted" else [],
            "status": status,
            "dtypes": list(dtypes),
            "trials": trials,
            "failures": failures[:20],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        # A temporary file of its own, then an atomic rename: a reader never sees a torn record.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(canonical_json(record))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path


def lookup(impl, constants: dict, runtime: dict, geometry: dict | None = None) -> dict | None:
    """The record for this impl, constants, source, runtime and model geometry, or None."""
    if impl.source_sha256 is None:
        return None
    try:
        return json.loads(_path(_key(impl.ref, constants, impl.source_sha256, runtime, geometry)).read_text("utf-8"))
    except (OSError, ValueError):
        return None


def is_admitted(impl, constants: dict, runtime: dict, case: str, geometry: dict | None = None) -> bool:
    record = lookup(impl, constants, runtime, geometry)
    return bool(record) and record.get("status") == "admitted" and case in record.get("cases_proven", [])
