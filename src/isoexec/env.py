"""Process settings read from the environment (`ISOEXEC_*` knobs that tune a kernel's path without changing a bit)."""


class EnvError(ValueError):
    """An `ISOEXEC_*` environment variable this process cannot take; the message names it and what it accepts.
    Raised when the module that reads it is imported, so the command line reports it in one line."""
