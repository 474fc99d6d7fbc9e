"""Checkpoints of an RL run: everything needed to continue it bit for bit, written atomically.

One file per checkpoint, `step-<n>.pt` in the checkpoint folder, holding plain data and tensors only,
read back with `torch.load(weights_only=True)` (which unpickles nothing else):

    format           FORMAT
    step             steps completed (0: right after the warm-up)
    config           the RLConfig as a dict
    policy           the policy's state dict
    masters          with a bfloat16 policy, its float32 master weights by parameter name (`precision.py`), else {}
    optimizer        the AdamW state dict (over the masters where there are): moments and per-parameter step counts

A parallel trainer's are put together from its shards (`state.whole_state`), so the file is the one a single
process writes, and a resume cuts them again for its ranks; it resumes at the layout it was written at (the
layout is part of the config), since gradients reduced in another order would leave the trajectory.
    history          the metrics of every completed step
    rng              {"torch": torch.get_rng_state(), "python": random.getstate()}
    weights_sha256   `weights_digest` of the policy (folded on a GPU, as the run's sync digests), checked again
                     once the weights are in the model
    content_sha256   SHA-256 over everything above, so a file altered on disk is refused

A file gets its final name only through `os.replace` of a fully written, fsynced temporary file in
the same folder, so a process killed at any instant leaves the previous checkpoint or the new one,
never a torn one. One writer per folder: `save` deletes temporary files that earlier writers left.
A file damaged later (a full disk, a bad copy, a stray file of that name) is skipped on resume in
favour of the newest intact checkpoint; other files in the folder are not looked at.
"""

import dataclasses
import hashlib
import os
import random
import re
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch

from ..model import Decoder
from .config import RLConfig, default_contract, default_warmup_steps
from .loop import RLRun, setup
from .parallel_mode import start_run
from .sync import weights_digest

FORMAT = "isoexec-rl-checkpoint/1"
KEEP = 2  # the newest but one survives, for a resume to fall back on if the newest is damaged later
NAME = re.compile(r"step-(\d+)\.pt")
# May change between a save and a resume. skip_bad_examples too: a run goes on under either value
# only when its data has nothing to drop, or with the value it was saved under.
# `engine` among them: vLLM through the plugin rolls out IsoExec's engine's tokens and bits (tests/vllm).
# gate_full_rows: which rows the gate holds against the trainer's, not what is sampled or trained.
TRAJECTORY_FREE = ("steps", "checkpoint_dir", "checkpoint_every", "trace", "skip_bad_examples", "engine", "gate_full_rows")
# Fields added to RLConfig since the first checkpoints, with the value a checkpoint without them ran under.
ADDED_FIELDS = {"model": None, "no_chat_template": False, "device": "cpu", "dtype": None, "model_vocab": False, "gate_full_rows": True,
                "engine_dp": 1}
FIELDS = {"step": int, "config": dict, "policy": dict, "masters": dict, "optimizer": dict, "history": list, "rng": dict,
          "weights_sha256": str}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: unreadable, altered, or written under another config."""


def checkpoints(directory) -> dict[int, Path]:
    """{step: path} of the checkpoints in `directory`, oldest first; {} when there is none."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    found = {int(m.group(1)): p for p in directory.iterdir() if (m := NAME.fullmatch(p.name)) and p.is_file()}
    return dict(sorted(found.items()))


def latest(directory) -> Path | None:
    found = checkpoints(directory)
    return found[max(found)] if found else None


def content_digest(payload: dict) -> str:
    """SHA-256 over a checkpoint's fields: tensors by dtype, shape and bytes, other values by repr."""
    digest = hashlib.sha256()

    def feed(value):
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"tensor:{t.dtype}:{tuple(value.shape)};".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            digest.update(f"dict:{len(value)};".encode())
            for key in sorted(value, key=repr):
                feed(key)
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"{type(value).__name__}:{len(value)};".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{type(value).__name__}:{value!r};".encode())

    feed({k: v for k, v in payload.items() if k != "content_sha256"})
    return "sha256:" + digest.hexdigest()


def save(run: RLRun, directory) -> Path:
    """Write `run` as it stands between steps to `directory`/step-<run.step>.pt; keep the newest KEEP."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = run.learner.checkpoint_state()
    payload = {
        "format": FORMAT,
        "step": run.step,
        "config": dataclasses.asdict(run.config),
        "policy": state["policy"],
        "masters": state["masters"],
        "optimizer": state["optimizer"],
        "history": run.history,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "weights_sha256": state["weights_sha256"],
    }
    payload["content_sha256"] = content_digest(payload)
    path = directory / f"step-{run.step:08d}.pt"
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o644)  # mkstemp makes 0600; a checkpoint is an ordinary file
            torch.save(payload, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    for old in list(checkpoints(directory).values())[:-KEEP]:
        old.unlink(missing_ok=True)
    for stale in directory.glob(".step-*.tmp"):
        stale.unlink(missing_ok=True)
    return path


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (a power cut, not only a killed process)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path) -> dict:
    """Read a checkpoint file and check its format, its fields and its content digest."""
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it then refuses
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling arbitrary bytes fails in arbitrary ways (KeyError, struct.error, …)
        raise CheckpointError(f"checkpoint {path} is unreadable (torn or corrupt): {_briefly(error)}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"checkpoint {path} has format {found!r}, expected {FORMAT!r}")
    stored, computed = payload.get("content_sha256"), content_digest(payload)
    payload.setdefault("masters", {})  # a file from before bfloat16 policies could be saved: its float32 policy has none
    wrong = [name for name, kind in FIELDS.items() if not isinstance(payload.get(name), kind)]
    if wrong:
        raise CheckpointError(f"checkpoint {path} lacks or mistypes {', '.join(wrong)}")
    if stored != computed:
        raise CheckpointError(f"checkpoint {path} is corrupt: its contents hash to {computed}, but it was written as {stored}")
    return payload


def config_differences(saved: dict, config: RLConfig) -> list[str]:
    """'field: checkpoint X, now Y' for every field that would change the run's trajectory."""
    saved, current = _as_run(saved), _as_run(dataclasses.asdict(config))
    missing = "(absent)"
    return [f"{name}: checkpoint {saved.get(name, missing)!r}, now {current.get(name, missing)!r}"
            for name in sorted(saved.keys() | current.keys())
            if name not in TRAJECTORY_FREE and saved.get(name, missing) != current.get(name, missing)]


def _as_run(config: dict) -> dict:
    """A config as the run it describes: the fields a checkpoint predates at the values it ran under, and
    the warm-up steps counted (a default of None and the 40 an older checkpoint wrote are the same run)."""
    config = {**ADDED_FIELDS, **config}
    if config.get("warmup_steps") is None:
        config["warmup_steps"] = default_warmup_steps(config["model"])
    if config.get("contract") is None:
        config["contract"] = default_contract(config["model"])  # the family's, as an older checkpoint names it
    return config


def restore(config: RLConfig, directory, warn: Callable[[str], None] | None = None) -> RLRun | None:
    """The run of the newest intact checkpoint in `directory`, ready for its next step; None when there is none.

    Newer checkpoints that cannot be read or fail a digest are skipped, `warn` told of each in one
    line; CheckpointError when none is intact, or when the one found was written under another config.
    """
    found = checkpoints(directory)
    if not found:
        return None
    _, spec, _ = setup(config)
    skipped = []
    for path in reversed(found.values()):
        try:
            payload = load(path)
        except CheckpointError as error:
            skipped.append(error)
            continue
        differences = config_differences(payload["config"], config)
        if differences:
            raise CheckpointError(f"checkpoint {path} was written under a different config ({'; '.join(differences)}); "
                                  "resume with the checkpoint's values or start in another checkpoint folder")
        try:
            policy = _policy(payload, path, spec)
            break
        except CheckpointError as error:
            skipped.append(error)
    else:
        raise CheckpointError(f"no intact checkpoint in {directory}: " + "; ".join(map(str, skipped)))
    for error in skipped if warn else ():
        warn(f"{error}; skipped it for {path.name}")
    run = start_run(config, initial=policy)  # skips the warm-up; its handshake syncs these weights to the engine
    try:
        if run.weights != payload["weights_sha256"]:
            raise CheckpointError(f"resuming from {path}: the engine received weights {run.weights}, expected {payload['weights_sha256']}")
        run.learner.load_checkpoint_state(payload["masters"], payload["optimizer"])
    except BaseException:
        run.close()
        raise
    run.step, run.history = payload["step"], payload["history"]
    # last: building the run may draw from the global generators
    torch.set_rng_state(payload["rng"]["torch"])
    random.setstate(payload["rng"]["python"])
    return run


def _policy(payload: dict, path: Path, spec) -> Decoder:
    """The checkpoint's policy, its weights digest checked; its optimiser state tried on it too, so
    that whatever fits here also loads into the run."""
    policy = Decoder(spec)
    try:
        policy.load_state_dict(payload["policy"])
        masters = payload["masters"]
        if masters and masters.keys() != dict(policy.named_parameters()).keys():
            raise KeyError("its master weights are not the policy's parameters")
        stepped = masters.values() if masters else policy.parameters()
        torch.optim.AdamW([torch.nn.Parameter(t) for t in stepped]).load_state_dict(payload["optimizer"])
        rng = payload["rng"]
        torch.Generator().set_state(rng["torch"])
        random.Random().setstate(rng["python"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:
        raise CheckpointError(f"checkpoint {path} holds state this run cannot load: {_briefly(error)}") from None
    for name, p in policy.named_parameters() if masters else ():  # every bfloat16 parameter its master's rounding
        if not torch.equal(masters[name].to(p.dtype).view(torch.int16), p.detach().view(torch.int16)):
            raise CheckpointError(f"checkpoint {path} is corrupt: parameter {name} is not its float32 master's rounding")
    digest = weights_digest(policy, payload["weights_sha256"].startswith("fold-"))
    if digest != payload["weights_sha256"]:
        raise CheckpointError(f"checkpoint {path} is corrupt: the policy loaded from it has digest {digest}, "
                              f"but it was saved with {payload['weights_sha256']}")
    return policy


def _briefly(error: Exception) -> str:
    """The error's type and first sentence: torch's messages run to paragraphs."""
    text = (str(error).strip().splitlines() or [""])[0]
    text = re.split(r"(?<=\.)\s", text, maxsplit=1)[0].rstrip(".")
    kind = type(error).__name__ if type(error).__module__ == "builtins" else f"{type(error).__module__}.{type(error).__name__}"
    return f"{kind}: {text}" if text else kind
