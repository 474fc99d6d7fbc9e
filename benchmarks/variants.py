"""Suffixes of a bench.py --contracts entry: the same contract run another way, timed side by side with it.

    +sync   its engine with async scheduling off;
    +gluon  attention.triton's tile in Gluon (ops/attention/gluon_tile.py, as ISOEXEC_ATTENTION_GLUON=1 sets it) for
            this entry's engine and trainer runs, the Triton walk for the others;
    +blocks decode calls of few programs with their key blocks spread over the grid (ops/attention/triton_blocks.py,
            as ISOEXEC_ATTENTION_BLOCKS_MIN=1 sets it) from one key block of the table, where the default takes it
            from 8;
    +walk   the spread decode off (ISOEXEC_ATTENTION_BLOCKS_MIN=off): every decode call walks its key blocks.
Each sets its kernels for its own entry's runs; the other entries take the defaults.
"""
import contextlib

SYNC, GLUON, BLOCKS, WALK = "+sync", "+gluon", "+blocks", "+walk"
SUFFIXES = (SYNC, GLUON, BLOCKS, WALK)


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
    switches = []  # (module, attribute, value)
    if has(label, GLUON):
        from isoexec.ops.attention import gluon_tile
        switches.append((gluon_tile, "ENABLED", True))
    if has(label, BLOCKS) and has(label, WALK):
        raise ValueError(f"{label}: +blocks and +walk contradict each other")
    if has(label, BLOCKS) or has(label, WALK):
        from isoexec.ops.attention import triton_blocks
        switches.append((triton_blocks, "BLOCKS_MIN", 1 if has(label, BLOCKS) else None))
    saved = [getattr(module, name) for module, name, _ in switches]
    for module, name, value in switches:
        setattr(module, name, value)
    try:
        yield
    finally:
        for (module, name, _), value in zip(switches, saved):
            setattr(module, name, value)
