"""The RL run's configuration: a typed, keyword-only dataclass validated before any work starts."""

import argparse
import ast
import dataclasses
import inspect
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path

ALGORITHMS = ("grpo", "dapo")
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")
# The rollout engines of the RL loop: IsoExec's own, and vLLM serving the policy through IsoExec's plugin (isoexec.vllm).
ENGINES = ("isoexec", "vllm")
# The warm-up teaches the random toy the answer format; a checkpoint is trained from what it already knows.
TOY_WARMUP_STEPS = 40


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    task: str = "addition"
    """embedded task name, or "jsonl" with `data`"""
    data: str | None = None
    """JSONL file of {"prompt", "answer"} objects (task "jsonl")"""
    skip_bad_examples: bool = False
    """drop, with a warning, the examples of the data the run cannot use (an empty prompt or one too long
    for the model with max_new_tokens more tokens, an answer longer than max_new_tokens) instead of
    refusing the data"""
    model: str | None = None
    """a Hugging Face checkpoint directory (config.json + *.safetensors; Qwen3, Qwen2, Llama, MiMo or
    Qwen3-MoE) to train with its own tokenizer, loaded in the policy's dtype (float32 on a CPU); or a
    model preset (e.g. tiny-moe): its shape with seeded random weights over the task's characters;
    default: a tiny random Qwen3 sized for the task's characters"""
    model_vocab: bool = False
    """with a model preset: keep the preset's vocabulary instead of the task's characters (ids past the alphabet
    decode to "�" and earn no reward), so the lm_head and the log-prob rows are as wide as a real model's"""
    no_chat_template: bool = False
    """with model: send each prompt as raw text instead of as a user message through the checkpoint's chat
    template (which is used where the checkpoint has one)"""
    contract: str | None = None
    """contract preset or file the rollout and the trainer run under ("native" for the fast path);
    default: the model family's (tiny-dense for the built-in model)"""
    algorithm: str = "dapo"
    """"grpo" (symmetric clip, per-sequence aggregation) or "dapo" (clip-higher, dynamic sampling,
    token-level aggregation, overlong shaping)"""
    steps: int = 40
    """RL steps (rollout + update)"""
    prompts_per_step: int = 16
    """distinct prompts per step"""
    group_size: int = 8
    """completions per prompt; advantages are normalised within a group"""
    max_new_tokens: int = 6
    """generation limit per completion"""
    temperature: float = 1.0
    """rollout sampling temperature (> 0)"""
    learning_rate: float = 5e-4
    """AdamW learning rate of the RL steps"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    grad_clip: float = 1.0
    """clip the gradient norm to this value"""
    optimizer_steps: int = 1
    """optimiser steps per rollout batch (each recomputes the trainer's log-probs)"""
    clip_eps_low: float = 0.2
    """lower PPO clip range ε_low (ratio ≥ 1 − ε_low)"""
    clip_eps_high: float | None = None
    """defaults to 0.28 for DAPO (clip-higher) and clip_eps_low for GRPO"""
    overlong_buffer: int = 2
    """DAPO overlong shaping: tokens before the limit where the penalty ramps up"""
    overlong_penalty: float = 0.5
    """DAPO overlong shaping: the penalty at the limit"""
    truncated_is_cap: float | None = None
    """cap C of truncated importance sampling, min(π_train/π_rollout, C); for the native path"""
    warmup_steps: int | None = None
    """supervised steps on task answers before RL, so the policy starts in the answer format; None: 40 for
    the built-in model, 0 with model"""
    warmup_learning_rate: float = 3e-3
    """AdamW learning rate of the warm-up"""
    seed: int = 0
    """seed of the weights, the prompts and the sampling"""
    checkpoint_dir: str | None = None
    """write checkpoints here, and resume from the latest one found"""
    checkpoint_every: int = 1
    """steps between checkpoints"""
    gate_full_rows: bool = True
    """gate every full-vocabulary log-prob row as well as the sampled tokens' log-probs; off: the tokens' only, and
    the engine returns no full rows"""
    trace: bool = False
    """on a gate failure, trace the mismatching token region by region"""
    trainer_tp: int = 1
    """the trainer's tensor-parallel size: processes on this machine (gloo), each holding its shard of the policy
    (docs/parallel.md)"""
    trainer_ep: int = 1
    """the trainer's expert-parallel size (an MoE model): the routed experts cut over its processes, 1 or trainer_tp, or
    trainer_tp x trainer_dp (the experts over every data-parallel group's processes)"""
    trainer_sp: bool = False
    """sequence parallelism on the trainer's tensor-parallel processes"""
    trainer_dp: int = 1
    """the trainer's data-parallel size: trainer_dp groups of its TP/EP processes, the policy sharded over them
    (FSDP2), each scoring its share of a step's sequences"""
    engine_tp: int = 1
    """the engine's tensor-parallel size, likewise; the weights are resharded to it on every sync"""
    engine_ep: int = 1
    """the engine's expert-parallel size, likewise"""
    engine_sp: bool = False
    """sequence parallelism on the engine's tensor-parallel processes"""
    engine_dp: int = 1
    """the engine's data-parallel size: engine_dp replicas of its TP/EP processes, each generating its share of a
    step's prompts; with engine_ep = engine_tp x engine_dp the experts are cut over every replica's processes and the
    replicas step together"""
    engine: str = "isoexec"
    """the rollout engine: isoexec (its own) or vllm (vLLM 0.32 in this process, serving the policy through IsoExec's
    plugin; unsharded; docs/vllm.md)"""
    device: str = "cpu"
    """where both sides compute: cpu, or cuda (a parallel side's processes share the GPU over gloo, or take one GPU each
    with ISOEXEC_DIST_BACKEND=nccl)"""
    dtype: str | None = None
    """the policy's dtype, float32 or bfloat16 (with float32 master weights in the optimiser); default: float32 on
    cpu, bfloat16 on cuda"""

    def __post_init__(self):
        from .tasks import TASKS

        if self.task != "jsonl" and self.task not in TASKS:
            raise ValueError(f'unknown task "{self.task}" (known: {", ".join([*TASKS, "jsonl"])})')
        if self.task == "jsonl" and not self.data:
            raise ValueError('task "jsonl" needs a data file')
        if self.data is not None and not Path(self.data).is_file():
            problem = "is a directory" if Path(self.data).is_dir() else "is not a regular file" if Path(self.data).exists() else "does not exist"
            raise ValueError(f"data file {self.data} {problem}")
        if self.model is not None and not (self.model and (Path(self.model).is_dir() or is_model_preset(self.model))):
            problem = "does not exist" if self.model and not Path(self.model).exists() else "is not a directory"
            raise ValueError(f"model {self.model} {problem} (expected a Hugging Face checkpoint directory or a model preset)")
        if self.model_vocab and (self.model is None or self.model_is_checkpoint):
            raise ValueError("model_vocab applies to a model preset (model); a checkpoint has its own tokenizer, the toy the task's")
        if self.no_chat_template and not self.model_is_checkpoint:
            raise ValueError("no_chat_template applies to a checkpoint's tokenizer (model); the built-in model and presets have no template")
        if self.checkpoint_dir is not None and Path(self.checkpoint_dir).exists() and not Path(self.checkpoint_dir).is_dir():
            raise ValueError(f"checkpoint_dir {self.checkpoint_dir} is not a directory")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f'algorithm must be one of {", ".join(ALGORITHMS)}, got "{self.algorithm}"')
        if not _is_int(self.group_size) or self.group_size < 2:
            raise ValueError(f"group_size must be at least 2 (advantages are normalised within a group), got {self.group_size!r}")
        for name in ("steps", "prompts_per_step", "max_new_tokens", "optimizer_steps", "checkpoint_every"):
            if not _is_int(getattr(self, name)) or not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "overlong_buffer"):
            value = getattr(self, name)
            if not (name == "warmup_steps" and value is None) and (not _is_int(value) or value < 0):
                raise ValueError(f"{name} must be an int ≥ 0, got {value!r}")
        if not _is_int(self.seed):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        for name in ("learning_rate", "warmup_learning_rate", "grad_clip", "clip_eps_low"):
            if not _is_finite(getattr(self, name)) or not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number, {_got(getattr(self, name))}")
        if not _is_finite(self.temperature) or not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for RL rollouts, {_got(self.temperature)}")
        for name in ("weight_decay", "overlong_penalty"):
            if not _is_finite(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a number ≥ 0, {_got(getattr(self, name))}")
        if self.clip_eps_high is not None and not (_is_finite(self.clip_eps_high) and self.clip_eps_high >= 0):
            raise ValueError(f"clip_eps_high must be a number ≥ 0 when given, {_got(self.clip_eps_high)}")
        if self.truncated_is_cap is not None and not (_is_finite(self.truncated_is_cap) and self.truncated_is_cap >= 1):
            raise ValueError(f"truncated_is_cap must be a number ≥ 1 when given, {_got(self.truncated_is_cap)}")
        for name in ("trainer_tp", "trainer_ep", "trainer_dp", "engine_tp", "engine_ep", "engine_dp"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        from ..parallel.mesh import world_of  # the one rule of which sizes make a side

        for side in ("trainer", "engine"):
            tp, ep, dp = (getattr(self, f"{side}_{name}") for name in ("tp", "ep", "dp"))
            try:
                world_of(tp, ep, dp)
            except ValueError as error:
                raise ValueError(f"{side}_tp {tp}, {side}_ep {ep}, {side}_dp {dp}: {error}") from None
        if self.device not in DEVICES:
            raise ValueError(f'device must be one of {", ".join(DEVICES)}, got "{self.device}"')
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f'dtype must be one of {", ".join(DTYPES)}, got "{self.dtype}"')
        if self.device == "cuda" and self.trainer_dp > 1 and os.environ.get("ISOEXEC_DIST_BACKEND", "gloo") != "nccl":
            raise ValueError("trainer_dp on the GPU runs over NCCL, a GPU a rank (ISOEXEC_DIST_BACKEND=nccl); FSDP over gloo with "
                             "ranks sharing a GPU is not built")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("device cuda: this machine has no CUDA device torch can use")
            if self.engine == "vllm":
                raise ValueError("engine vllm runs on the CPU build of vLLM here: use device cpu")
        if self.engine not in ENGINES:
            raise ValueError(f'engine must be one of {", ".join(ENGINES)}, got "{self.engine}"')
        if self.engine == "vllm" and (max(self.engine_tp, self.engine_ep, self.engine_dp) > 1 or self.engine_sp or self.trace):
            raise ValueError("engine vllm runs unsharded (engine_tp, engine_ep, engine_dp 1, no engine_sp) and without trace so far")
        if self.parallel and self.trace:
            raise ValueError("trace needs the engine and the trainer in one process; it does not run with a parallel side")

    @property
    def eps_high(self) -> float:
        if self.clip_eps_high is not None:
            return self.clip_eps_high
        return 0.28 if self.algorithm == "dapo" else self.clip_eps_low

    @property
    def parallel(self) -> bool:
        """Whether a side runs in processes of its own (any parallel size above 1, or sequence parallelism)."""
        return max(self.trainer_tp, self.trainer_ep, self.trainer_dp, self.engine_tp, self.engine_ep, self.engine_dp) > 1 or self.trainer_sp or self.engine_sp

    def layout(self, side: str) -> dict:
        """A side's parallel sizes, as `parallel.spawn` and `RankGroup` take them."""
        return {name: getattr(self, f"{side}_{name}") for name in ("tp", "ep", "sp", "dp")}

    @property
    def policy_dtype(self) -> str:
        """The dtype both sides compute the policy in: `dtype`, else float32 on a CPU and bfloat16 on a GPU."""
        return self.dtype or ("float32" if self.device == "cpu" else "bfloat16")

    @property
    def master_weights(self) -> bool:
        """Whether the optimiser steps float32 master weights of a lower-precision policy (`rl/precision.py`)."""
        return self.policy_dtype != "float32"

    @property
    def model_is_checkpoint(self) -> bool:
        return self.model is not None and not is_model_preset(self.model)

    @property
    def num_warmup_steps(self) -> int:
        return default_warmup_steps(self.model) if self.warmup_steps is None else self.warmup_steps

    def replace(self, **changes) -> "RLConfig":
        return dataclasses.replace(self, **changes)


def default_warmup_steps(model: str | None) -> int:
    """0 for a checkpoint (it writes text already), the toy's warm-up for random weights."""
    return 0 if model is not None and not is_model_preset(model) else TOY_WARMUP_STEPS


def default_contract(model: str | None) -> str:
    """The contract a run takes without --contract: its model family's (tiny-dense for the built-in toy)."""
    if model is None:
        return "tiny-dense"
    from ..model import family_of, spec_of

    return family_of(spec_of(model)).contract


def is_model_preset(model: str) -> bool:
    from ..model import is_preset  # imported here: `isoexec train --help` should not wait for torch

    return is_preset(model)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value) -> bool:
    """A real number that is neither infinite nor NaN (bools are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _got(value) -> str:
    """'got X', saying why an infinite or NaN X is refused where it would pass a comparison."""
    return f"got {value!r}" + (", which is not finite" if isinstance(value, float) and not math.isfinite(value) else "")


def _field_docs() -> dict[str, str]:
    """The string under each field in RLConfig's source: it doubles as the field's --help."""
    docs, tree = {}, ast.parse(inspect.getsource(RLConfig))
    body = tree.body[0].body
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


# What a path-valued flag takes, in --help.
METAVARS = {"data": "FILE", "model": "DIR|PRESET", "contract": "PRESET|FILE", "checkpoint_dir": "DIR", "device": "cpu|cuda",
            "dtype": "float32|bfloat16"}


def add_config_flags(parser: argparse.ArgumentParser, defaults: dict | None = None) -> None:
    """One --flag per RLConfig field (help from the field's docstring), default from RLConfig."""
    docs = _field_docs()
    for f in dataclasses.fields(RLConfig):
        default = (defaults or {}).get(f.name, f.default)
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{docs.get(f.name, f.name.replace('_', ' '))} (default: {default})"
        if f.type is bool:  # a field on by default is turned off by --no-<name>
            action = argparse.BooleanOptionalAction if default else "store_true"
            parser.add_argument(flag, action=action, default=default, help=help_text)
            continue
        kind = next((t for t in (int, float, str) if t is f.type or t in typing.get_args(f.type)), str)
        parser.add_argument(flag, type=kind, default=default, metavar=METAVARS.get(f.name, f.name.upper()), help=help_text)


def config_from_args(args: argparse.Namespace) -> RLConfig:
    return RLConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RLConfig)})
