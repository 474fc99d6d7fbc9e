"""Weights in and out: Hugging Face safetensors checkpoints, and seeded random initialisation."""

import dataclasses
import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .decoder import Decoder
from .families import family_of, is_preset, read_config, spec_of
from .spec import ModelSpec, SpecError

log = logging.getLogger(__name__)


def init_random(spec: ModelSpec, seed: int = 0) -> Decoder:
    """A model with weights drawn from seeded generators (`random_weights`): the same seed gives the same bits anywhere."""
    model = Decoder(spec)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, values in random_weights(spec, seed):
            params[name].copy_(values)
    return model


# A parameter's values, flattened in row-major order, are drawn in blocks of this many, each block from its own
# generator, so the blocks of one weight can be drawn on several cores at once.
DRAW_BLOCK = 2**20


def block_seed(seed: int, name: str, block: int) -> int:
    """The seed of block `block` of parameter `name`: 63 bits of SHA-256 over the model seed, the name and the block."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()[:8], "little") >> 1


def _draw_block(out: Tensor, seed: int, name: str, block: int) -> None:
    torch.randn(out.shape, generator=torch.Generator().manual_seed(block_seed(seed, name, block)), out=out)


def random_weights(spec: ModelSpec, seed: int = 0, workers: int | None = None):
    """(name, tensor) of every parameter `init_random` loads, by name, one at a time: a caller can keep a part
    of each (`parallel.random_shard`) without the whole model in memory. The model is built on the meta device
    only for its parameters' names and shapes.

    A parameter's values are standard normals, scaled by 0.05 (norms: 1 + 0.1 x), rounded once to its dtype;
    each DRAW_BLOCK of them comes from a generator of its own (`block_seed`), and `workers` threads draw the
    blocks of a weight at once (torch's normal draw runs on one core, ~100 M values a second: one stream for a
    35B-parameter model took minutes on every rank that needed its shard). The thread count never changes a value."""
    with torch.device("meta"):
        model = Decoder(spec)
    workers = max(1, torch.get_num_threads()) if workers is None else workers
    with ThreadPoolExecutor(workers) as pool:
        for name, param in sorted(model.named_parameters()):
            flat = torch.empty(param.numel(), device="cpu")  # the generators are CPU generators
            blocks = [pool.submit(_draw_block, flat[start : start + DRAW_BLOCK], seed, name, i)
                      for i, start in enumerate(range(0, flat.numel(), DRAW_BLOCK))]
            for block in blocks:
                block.result()
            values = flat.view(param.shape)
            yield name, (1.0 + 0.1 * values if name.endswith("norm.weight") else 0.05 * values).to(param.dtype)


def save(model: Decoder, directory: str | Path) -> Path:
    """Write config.json and model.safetensors as a Hugging Face checkpoint (tied lm_head omitted)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(family_of(model.spec).to_hf_config(model.spec), indent=2), "utf-8")
    # Copies: joined siblings (`layers/params.join`) share storage, which safetensors refuses.
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if model.spec.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    tensors = family_of(model.spec).export(tensors, model.spec)
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def _checkpoint_tensors(directory: Path) -> dict:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise SpecError(f"{directory}: no *.safetensors weights")
    tensors = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as error:
            raise SpecError(f"{file}: unreadable safetensors ({error})") from None
    return tensors


def load(directory: str | Path, dtype: str | None = None) -> Decoder:
    """Load a Hugging Face checkpoint directory (config.json + *.safetensors) into our model."""
    directory = Path(directory)
    spec = read_config(directory)
    if dtype is not None:
        spec = dataclasses.replace(spec, dtype=dtype)
    model = Decoder(spec)
    assign(model, _checkpoint_tensors(directory), str(directory))
    return model


def assign(model: Decoder, tensors: dict, source: str) -> None:
    """Copy a checkpoint's tensors (Hugging Face names) into `model`: the family's renames and splits, its
    ignored prefixes left out with one logged line; a missing, unexpected or misshapen tensor is a SpecError."""
    spec = model.spec
    family = family_of(spec)
    prefixes = family.ignored_prefixes(spec)
    ignored = sorted(k for k in tensors if k.startswith(prefixes)) if prefixes else []
    if ignored:
        log.warning("%s: ignored %d checkpoint tensors under %s (%s does not use them for rollout or training)",
                    source, len(ignored), ", ".join(prefixes), spec.architecture)
        tensors = {k: v for k, v in tensors.items() if not k.startswith(prefixes)}
    tensors = family.adapt(tensors, spec)
    expected = dict(model.state_dict())
    if spec.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        tensors.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise SpecError(f"{source}: weights do not match {spec.architecture}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, target in expected.items():
            if tensors[name].shape != target.shape:
                raise SpecError(f"{source}: {name} has shape {tuple(tensors[name].shape)}, expected {tuple(target.shape)}")
            target.copy_(tensors[name].to(target.dtype))


def load_model(source: str | Path, *, seed: int = 0, dtype: str | None = None) -> Decoder:
    """A preset name (random weights from `seed`) or a checkpoint directory."""
    spec = spec_of(source)
    if is_preset(source):
        return init_random(spec if dtype is None else dataclasses.replace(spec, dtype=dtype), seed)
    return load(source, dtype)
