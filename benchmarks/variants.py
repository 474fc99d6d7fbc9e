"""Suffixes of a bench.py --contracts entry: the same contract run another way, timed side by side with it.

    +sync   its engine with async scheduling off;
    +gluon  attention.triton's tile in Gluon (ops/attention/gluon_tile.py, as ISOEXEC_ATTENTION_GLUON=1 sets it) for
            this entry's engine and trainer runs, the Triton walk for the others.
"""
import contextlib

SYNC, GLUON = "+sync", "+gluon"
SUFFIXES = (SYNC, GLUON)


def base(spec: str) -> str:
    """The entry without its suffixes: the contract's preset name or file."""
    while spec.endswith(SUFFIXES):
        spec = next(spec.removesuffix(s) for s in SUFFIXES if spec.endswith(s))
    return spec


def has(label: str, suffix: str) -> bool:
    return suffix in label[len(base(label)):]


@contextlib.contextmanager
def kernels(label: str):
    """The kernels this label's runs take, set for the `with` block."""
    if not has(label, GLUON):
        yield
        return
    from isoexec.ops.attention import gluon_tile

    saved, gluon_tile.ENABLED = gluon_tile.ENABLED, True
    try:
        yield
    finally:
        gluon_tile.ENABLED = saved
