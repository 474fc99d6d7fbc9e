"""Weights in and out: Hugging Face safetensors checkpoints, and seeded random initialisation."""

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .dense import DenseModel
from .spec import PRESETS, ModelSpec, SpecError, read_config


def init_random(spec: ModelSpec, seed: int = 0) -> DenseModel:
    """A model with weights drawn from a seeded generator: the same seed gives the same bits anywhere."""
    model = DenseModel(spec)
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            values = 1.0 + 0.1 * torch.randn(param.shape, generator=generator)
        else:
            values = 0.05 * torch.randn(param.shape, generator=generator)
        with torch.no_grad():
            param.copy_(values.to(param.dtype))
    return model


def save(model: DenseModel, directory: str | Path) -> Path:
    """Write config.json and model.safetensors as a Hugging Face checkpoint (tied lm_head omitted)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(model.spec.to_hf_config(), indent=2), "utf-8")
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.spec.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def load(directory: str | Path, dtype: str | None = None) -> DenseModel:
    """Load a Hugging Face checkpoint directory (config.json + *.safetensors) into our model."""
    directory = Path(directory)
    spec = read_config(directory)
    if dtype is not None:
        spec = ModelSpec(**{**spec.__dict__, "dtype": dtype})
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise SpecError(f"{directory}: no *.safetensors weights")
    tensors = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as error:
            raise SpecError(f"{file}: unreadable safetensors ({error})") from None
    model = DenseModel(spec)
    expected = dict(model.state_dict())
    if spec.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        tensors.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise SpecError(f"{directory}: weights do not match {spec.architecture}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, target in expected.items():
            if tensors[name].shape != target.shape:
                raise SpecError(f"{directory}: {name} has shape {tuple(tensors[name].shape)}, expected {tuple(target.shape)}")
            target.copy_(tensors[name].to(target.dtype))
    return model


def load_model(source: str | Path, *, seed: int = 0, dtype: str | None = None) -> DenseModel:
    """A preset name (random weights from `seed`) or a checkpoint directory."""
    if str(source) in PRESETS and not Path(source).exists():
        spec = PRESETS[str(source)]
        if dtype is not None:
            spec = ModelSpec(**{**spec.__dict__, "dtype": dtype})
        return init_random(spec, seed)
    if not Path(source).is_dir():
        raise SpecError(f"{source!r} is neither a model preset ({', '.join(PRESETS)}) nor a checkpoint directory")
    return load(source, dtype)
