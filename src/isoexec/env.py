"""Process settings read from the environment (`ISOEXEC_*` knobs that tune a kernel's path without changing a bit)."""
import os


class EnvError(ValueError):
    """An `ISOEXEC_*` environment variable this process cannot take; the message names it and what it accepts.
    Raised when the module that reads it is imported, so the command line reports it in one line."""


def switch(name: str, default: bool) -> bool:
    """An on/off knob: "1" or "0", unset or empty for `default`; anything else is refused in one line."""
    value = os.environ.get(name, "")
    if value == "":
        return default
    if value not in ("0", "1"):
        raise EnvError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"
