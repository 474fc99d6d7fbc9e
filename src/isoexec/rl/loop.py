"""The on-policy RL loop: rollout in the engine, recompute in the trainer, gate, update, sync.

One step: sample prompts (seeded by (seed, step)), generate `group_size` completions per prompt,
score them, normalise advantages within each group, recompute the log-probs of the generated tokens
in `trainer_fwd`, gate them against the rollout's, take `optimizer_steps` AdamW steps, and send the
weights to the engine with a digest check on both sides. Everything a step draws is derived from
(seed, step), so a run resumed from a checkpoint continues bit for bit.

The policy is the built-in toy (a tiny random Qwen3 over the task's characters) or, with `model`, a
Hugging Face checkpoint with its own tokenizer (`tasks/tokenizer.py`), in float32 either way.

The two sides are `Rollout` and `Learner`; `RLRun` only talks to them through their methods, so the
same loop drives them in this process, as Ray actors (`ray_mode.py`), or as groups of processes at their own
parallel layouts (`parallel_mode.py`).
"""

import dataclasses
import random
import time

import torch

from ..audit.trace import Tracer
from ..contract import fit_contract
from ..contract import load as load_contract
from ..engine import EngineConfig, LLMEngine, SamplingParams
from ..model import PRESETS, Decoder, ModelSpec, dense_spec, init_random, read_config, tracing
from ..model import load as load_checkpoint
from ..parallel import Mesh, random_shard, shard
from ..parallel.plan import shard_state
from ..parallel.weights import GradNorm, unshard_state
from ..runtime import check
from ..trainer import Trainer
from . import losses, transfer
from .config import RLConfig, default_contract
from .gate import gate
from .handshake import ensure_admitted, side_fingerprint
from .precision import MasterWeights
from .state import load_whole_state, whole_state
from .sync import Digest, WeightSyncError, load_state, state_bytes, state_digest, weights_digest
from .transfer import Bucket
from .tasks import Task, checks, load_task
from .tasks.tokenizer import checkpoint_tokenizer
from .warmup import warmup

# The policy's dtype on a CPU, the toy's and a checkpoint's alike: a CPU has no fast bfloat16 matmul to gain. On a
# GPU it is bfloat16 (`RLConfig.policy_dtype`), which the contracts' GPU kernels take, with float32 master weights.
RL_DTYPE = "float32"


def task_model_spec(task: Task, max_new_tokens: int, dtype: str = RL_DTYPE) -> ModelSpec:
    """A tiny Qwen3-style model sized for the task's alphabet, in float32 for training on a CPU."""
    return dense_spec(architecture="Qwen3ForCausalLM", vocab_size=task.tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                     rope_theta=10_000.0, max_position_embeddings=64 + max_new_tokens, tie_word_embeddings=True, dtype=dtype,
                     eos_token_id=task.tokenizer.EOS)


def preset_spec(task: Task, preset: str, max_new_tokens: int, dtype: str = RL_DTYPE, model_vocab: bool = False) -> ModelSpec:
    """A model preset's shape over the task's characters (or its own vocabulary), as long as the toy's."""
    vocab_size = max(PRESETS[preset].vocab_size, task.tokenizer.vocab_size) if model_vocab else task.tokenizer.vocab_size
    return PRESETS[preset].replace(vocab_size=vocab_size, max_position_embeddings=64 + max_new_tokens, dtype=dtype,
                                   eos_token_id=task.tokenizer.EOS)


def checkpoint_spec(directory, dtype: str = RL_DTYPE) -> ModelSpec:
    """The checkpoint's config.json as our model spec, in `dtype` (as `load_checkpoint(dtype=)` builds it)."""
    return dataclasses.replace(read_config(directory), dtype=dtype)


def task_and_spec(config: RLConfig) -> tuple[Task, ModelSpec]:
    """The config's task over its tokenizer, and the policy's shape: the toy sized for the task, or the
    checkpoint's with its own tokenizer."""
    dtype = config.policy_dtype
    if not config.model_is_checkpoint:
        task = load_task(config.task, config.data)
        if config.model is not None:
            return task, preset_spec(task, config.model, config.max_new_tokens, dtype, config.model_vocab)
        return task, task_model_spec(task, config.max_new_tokens, dtype)
    spec = checkpoint_spec(config.model, dtype)
    tokenizer = checkpoint_tokenizer(config.model, spec, chat_template=not config.no_chat_template)
    return load_task(config.task, config.data, tokenizer), spec


def initial_model(config: RLConfig, spec: ModelSpec) -> Decoder:
    """The policy before the warm-up: the checkpoint's weights, or the toy's (or a preset's) seeded random ones."""
    if not config.model_is_checkpoint:
        return init_random(spec, config.seed)
    return load_checkpoint(config.model, dtype=spec.dtype)


def longest_prompt(task: Task) -> int:
    """The most tokens a prompt of the task is sent as."""
    return max(len(task.tokenizer.encode_prompt(p)) for p in task.prompts)


def start_lines(config: RLConfig, task: Task) -> list[str]:
    """What a fresh run says before its first step: the checkpoint and how its prompts are sent; the warm-up."""
    lines = []
    if config.model is not None and not config.model_is_checkpoint:
        over = "its own vocabulary" if config.model_vocab else "the task's characters"
        lines.append(f"policy: preset {config.model}, random weights over {over}, in {config.policy_dtype}, on {config.device}")
    elif config.model is not None:
        sent = "through its chat template" if task.tokenizer.uses_chat_template else "as raw text"
        lines.append(f"policy: {config.model} in {config.policy_dtype}, prompts sent {sent}")
    if config.num_warmup_steps:
        lines.append(f"warm-up: {config.num_warmup_steps} supervised steps on task {task.name} (native fast path)…")
    return lines


def request_seed(seed: int, step: int, index: int) -> int:
    return ((seed * 1_000_003 + step) * 65_536 + index) % (1 << 62)


def usable_task(config: RLConfig) -> tuple[Task, str | None]:
    """The config's task, its data checked against the model's length (tasks/checks.py): (task, None),
    or with `skip_bad_examples` (task without the unusable examples, a note of what was dropped)."""
    return _usable(config, *task_and_spec(config))


def _usable(config: RLConfig, task: Task, spec: ModelSpec) -> tuple[Task, str | None]:
    return checks.usable_task(task, max_length=spec.max_position_embeddings, max_new_tokens=config.max_new_tokens,
                              skip=config.skip_bad_examples)


def setup(config: RLConfig):
    """What both sides derive from the config alone: the task, the model shape, the fitted contract."""
    task, spec = task_and_spec(config)
    task, _ = _usable(config, task, spec)
    profile = config.model if config.model is not None else f"task:{task.name}"
    contract = fit_contract(load_contract(config.contract or default_contract(config.model)), spec, device=config.device, profile=profile)
    return task, spec, contract


class Rollout:
    """The engine side: its own copy of the weights, updated only through `load_weights`. With a `mesh` (a rank of a
    parallel engine, `parallel_mode.py`), the rank's shard of them."""

    def __init__(self, config: RLConfig, mesh: Mesh | None = None):
        task, self.spec, self.contract = setup(config)
        self.mesh = mesh if mesh is not None else Mesh()
        self.device = config.device
        self.folded = config.device != "cpu"  # the digest's form (rl/sync.py)
        self.model = _initial_rank_model(config, self.spec, self.contract, self.mesh).to(config.device)
        page = self.contract.deployment.engine.kv_page_size
        pages = config.prompts_per_step * config.group_size * -(-(longest_prompt(task) + config.max_new_tokens) // page)
        # A parallel engine runs eagerly, as the audit's does: its graphs are not built yet (`ModelRunner`).
        graphs = {"cuda_graphs": False} if self.mesh.world > 1 else {}
        self.engine = LLMEngine(self.model, self.contract, EngineConfig.from_contract(self.contract, num_pages=pages + 1, **graphs),
                                device=config.device, mesh=self.mesh)
        self._received = None  # the digest of the buckets received so far (`receive_bucket`)

    @property
    def binding(self):
        return self.engine.binding

    @property
    def rank_spec(self) -> ModelSpec:
        """The shapes this process runs: its shard's."""
        return self.model.spec

    def fingerprint(self) -> dict:
        return side_fingerprint(self.binding, "engine", device=self.device, spec=self.rank_spec, mesh=self.mesh)

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params, progress=False)

    def load_weights(self, tensors: dict, digest: str) -> str:
        """Load the whole model's weights (the rank's shards of them) and return the digest (rl/sync.py) of the whole
        logical weights this side now holds, put together again from every rank's shards; it must be the sender's."""
        if self.mesh.world == 1:
            return load_state(self.model, tensors, digest, self.folded)
        state = self.model.state_dict()
        with torch.no_grad():
            for name, part in shard_state(tensors, self.spec, self.contract, self.mesh).items():
                state[name].copy_(part)
        received = state_digest(unshard_state(self.model.state_dict(), self.spec, self.contract, self.mesh), self.folded)
        if received != digest:
            raise WeightSyncError(f"weights arrived corrupted: sender {digest}, receiver {received}")
        return received


    def receive_bucket(self, bucket: Bucket) -> None:
        """Cut this rank's shards of a bucket the trainer published (`transfer.py`) into the model, then put them
        together again: rank 0 digests the whole logical weights the engine now holds (`finish_receive`)."""
        state = self.model.state_dict()
        with transfer.opened(bucket, torch.device(self.device)) as whole, torch.no_grad():
            for name, part in shard_state(whole, self.spec, self.contract, self.mesh).items():
                state[name].copy_(part)
        held = unshard_state({name: state[name] for name in bucket.names}, self.spec, self.contract, self.mesh, first_only=True)
        if _is_first_rank():
            self._received = self._received or Digest(self.folded)
            self._received.update({name: t.to(self.device) for name, t in held.items()})

    def finish_receive(self) -> str | None:
        """The digest of every bucket received since the last call (rank 0's; None on the others)."""
        received, self._received = self._received, None
        return received.hexdigest() if received is not None else None


def _is_first_rank() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def local_rollout(config: RLConfig):
    """The engine side in this process: IsoExec's engine, or vLLM's (`isoexec.vllm.rollout.VllmRollout`)."""
    if config.engine == "vllm":
        from ..vllm.rollout import VllmRollout

        return VllmRollout(config)
    return Rollout(config)


def _rank_model(model: Decoder, contract, mesh: Mesh) -> Decoder:
    return shard(model, contract, mesh) if mesh.world > 1 else model


def _initial_rank_model(config: RLConfig, spec: ModelSpec, contract, mesh: Mesh) -> Decoder:
    """The rank's part of the policy before any training: seeded random weights drawn shard by shard on a rank of a
    parallel side (`random_shard`: the whole model is never in one process), else the whole initial model cut."""
    if mesh.world > 1 and not config.model_is_checkpoint:
        return random_shard(spec, config.seed, contract, mesh)
    return _rank_model(initial_model(config, spec), contract, mesh)


class Learner:
    """The trainer side: the policy, its optimiser, the gate and the update. With a `mesh` (a rank of a parallel
    trainer, `parallel_mode.py`), the policy is the rank's shard of the model (FSDP-sharded further with DP)."""

    def __init__(self, config: RLConfig, initial: Decoder | None = None, mesh: Mesh | None = None):
        self.config = config
        self.task, self.spec, self.contract = setup(config)
        self.mesh = mesh if mesh is not None else Mesh()
        self.device = torch.device(config.device)
        if initial is None and config.num_warmup_steps == 0:
            policy = _initial_rank_model(config, self.spec, self.contract, self.mesh)
        else:
            policy = _rank_model(initial if initial is not None else warmup(initial_model(config, self.spec), self.task, config),
                                 self.contract, self.mesh)
        self.trainer = Trainer(policy.to(self.device), self.contract, self.mesh)
        self.policy = self.trainer.model
        # The optimiser steps float32 masters of a bfloat16 policy (rl/precision.py), else the policy itself.
        self.master = MasterWeights(self.policy) if config.master_weights else None
        stepped = self.master if self.master is not None else self.policy
        self.optimizer = torch.optim.AdamW(stepped.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        self.grad_norm = GradNorm(self.spec, self.contract, self.mesh) if self.parallel else None
        self._outbox, self._sent = transfer.Outbox(), None  # the weight sync's last bucket and digest so far (`send_bucket`)
        self.step = 0  # the RL step being trained on, for reports

    @property
    def parallel(self) -> bool:
        return self.mesh.world * self.mesh.dp > 1

    @property
    def binding(self):
        return self.trainer.binding

    @property
    def rank_spec(self) -> ModelSpec:
        """The shapes this process runs: its shard's."""
        return self.policy.spec

    def fingerprint(self) -> dict:
        return side_fingerprint(self.binding, "trainer", device=self.device.type, spec=self.rank_spec, mesh=self.mesh)

    def weights(self) -> tuple[dict, str]:
        """The whole model's weights (put together from every rank's shards) and their digest. On a GPU, in this
        process, the policy's own tensors: the engine copies them device to device before the next update."""
        folded = self.device.type != "cpu"
        if not self.parallel:
            if folded:
                return {name: t.detach() for name, t in self.policy.state_dict().items()}, weights_digest(self.policy, folded)
            return state_bytes(self.policy), weights_digest(self.policy)
        whole = unshard_state(self.policy.state_dict(), self.spec, self.contract, self.mesh)
        # They travel pickled to the engine's processes: from host memory.
        return {name: t.cpu() for name, t in whole.items()}, state_digest(whole, folded)

    def send_bucket(self, names: list[str]) -> Bucket | None:
        """Put together the whole of `names`' weights and, on rank 0, publish them for the engine's ranks to read
        (`transfer.py`), letting go of the bucket published before (the engine has read it). Rank 0 returns it."""
        state = self.policy.state_dict()
        whole = unshard_state({name: state[name] for name in names}, self.spec, self.contract, self.mesh, first_only=True)
        if not _is_first_rank():
            return None
        whole = {name: t.to(self.device) for name, t in whole.items()}
        self._sent = self._sent or Digest(self.device.type != "cpu")
        self._sent.update(whole)
        return self._outbox.publish(whole, self.device)

    def checkpoint_state(self) -> dict | None:
        """The policy, masters and optimiser state, whole (`state.whole_state`; a parallel side's first rank only)."""
        return whole_state(self, self.device.type != "cpu")

    def load_checkpoint_state(self, masters: dict, optimizer: dict) -> None:
        """This rank's part of a checkpoint's whole masters and optimiser state (`state.load_whole_state`)."""
        load_whole_state(self, masters, optimizer)

    def finish_send(self) -> str | None:
        """Let go of the last bucket; the digest of every bucket sent since the last call (rank 0's)."""
        self._outbox.release()
        sent, self._sent = self._sent, None
        return sent.hexdigest() if sent is not None else None

    def update(self, kept, advantages: torch.Tensor, step: int) -> dict:
        cfg, self.step = self.config, step
        device = self.device
        sequences = [c.prompt + c.token_ids for c in kept]
        rollout_logp = torch.cat([c.logprobs for c in kept]).to(device)  # [T]
        seq_index = torch.cat([torch.full((len(c.token_ids),), i) for i, c in enumerate(kept)]).to(device)
        advantages = advantages.to(device)
        out = {}
        for k in range(cfg.optimizer_steps):
            rows = self.trainer.logprobs(sequences, case="trainer_fwd", device=device)
            generated = [r[len(c.prompt) - 1 :] for r, c in zip(rows, kept)]
            logp = torch.cat([g.gather(-1, torch.tensor(c.token_ids, device=device)[:, None])[:, 0] for g, c in zip(generated, kept)])  # [T]
            if k == 0:
                out |= gate(self, kept, generated)
                old = logp.detach() if cfg.truncated_is_cap else rollout_logp
                weights = torch.clamp(torch.exp(old - rollout_logp), max=cfg.truncated_is_cap) if cfg.truncated_is_cap else None
            loss, stats = losses.policy_loss(logp, old, advantages, seq_index, eps_low=cfg.clip_eps_low, eps_high=cfg.eps_high,
                                             aggregation="token" if cfg.algorithm == "dapo" else "sequence", weights=weights)
            self.optimizer.zero_grad(set_to_none=True)
            self.policy.zero_grad(set_to_none=True)  # with masters the optimiser clears theirs, not what a warm-up left here
            loss.backward()
            stepped = self.policy
            if self.master is not None:
                self.master.take_grads()
                stepped = self.master
            for _, p in stepped.named_parameters():
                # A rank's experts that no token reached have no gradient; in one process they are rows of a whole
                # expert tensor, whose gradient there is zero: AdamW steps them alike (moments, weight decay).
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            if self.grad_norm is not None:  # the norm over the whole model's gradient, each element once
                grad_norm = self.grad_norm.clip(stepped.named_parameters(), cfg.grad_clip)
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(stepped.parameters(), cfg.grad_clip)
            self.optimizer.step()
            if self.master is not None:
                self.master.write_back()
        return out | {"loss": float(loss.detach()), "grad_norm": float(grad_norm), **stats}

    def trace(self, request_id: int, position: int) -> dict:
        """Needs the engine in this process: set by RLRun for in-process runs."""
        if getattr(self, "replay", None) is None:
            return {"summary": "tracing needs the engine in the trainer's process (not available in Ray mode)"}
        return self.replay(request_id, position)


class RLRun:
    """Drives one Rollout and one Learner (local objects, or Ray actors behind the same methods)."""

    def __init__(self, config: RLConfig, *, initial: Decoder | None = None, rollout=None, learner=None, send_weights=None):
        self.config = config
        self.send_weights = send_weights  # the weight sync when the sides pass weights between them, else None (`sync`)
        self.task, spec, self.contract = setup(config)
        ensure_admitted(self.contract, config.device, spec=spec)
        self.learner = learner if learner is not None else Learner(config, initial)
        self.rollout = rollout if rollout is not None else local_rollout(config)
        if isinstance(self.learner, Learner) and isinstance(self.rollout, Rollout):
            self.learner.replay = self._replay
        trainer, engine = self.learner.fingerprint(), self.rollout.fingerprint()
        self.verdict = check(trainer, engine).raise_if_refused()
        self.layout = {"trainer": trainer["parallel"], "engine": engine["parallel"]}  # each side's sizes, as its rank 0 runs them
        self.step = 0
        self.history: list[dict] = []
        self.weights = self.sync()

    def close(self) -> None:
        """Stop the sides' processes where they run in their own (`parallel_mode.py`)."""
        for side in (self.learner, self.rollout):
            getattr(side, "close", lambda: None)()

    def sync(self) -> str:
        """The trainer's weights into the engine; the digest both sides computed of them."""
        if self.send_weights is not None:  # rank to rank, a bucket at a time (parallel_mode.py)
            return self.send_weights()
        tensors, digest = self.learner.weights()
        return self.rollout.load_weights(tensors, digest)

    def requests(self):
        cfg, tok = self.config, self.task.tokenizer
        examples = self.task.sample(random.Random(f"{cfg.seed}:{self.step}"), cfg.prompts_per_step)
        prompts = [tok.encode_prompt(e.prompt) for e in examples for _ in range(cfg.group_size)]
        params = [SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_new_tokens, seed=request_seed(cfg.seed, self.step, i),
                                 stop_token_ids=tok.eos_token_ids, return_full_logprobs=cfg.gate_full_rows) for i in range(len(prompts))]
        return examples, prompts, params

    def run_step(self) -> dict:
        cfg, start = self.config, time.perf_counter()
        examples, prompts, params = self.requests()
        completions = self.rollout.generate(prompts, params)  # returns once the tokens are on the host
        generated = time.perf_counter()
        texts = [self.task.tokenizer.decode(c.token_ids) for c in completions]
        rewards = torch.tensor([self.task.reward(examples[i // cfg.group_size], t) for i, t in enumerate(texts)], dtype=torch.float32)
        accuracy = float(rewards.mean())
        if cfg.algorithm == "dapo":
            lengths = torch.tensor([len(c.token_ids) for c in completions])
            truncated = torch.tensor([c.finish_reason == "length" for c in completions])
            rewards = rewards + losses.overlong_penalty(lengths, truncated, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
            keep = losses.informative_groups(rewards, cfg.group_size)
        else:
            keep = torch.ones(len(completions), dtype=torch.bool)
        advantages = losses.group_advantages(rewards, cfg.group_size)[keep]
        kept = [c for c, k in zip(completions, keep.tolist()) if k]
        metrics = {"step": self.step, "reward": float(rewards.mean()), "accuracy": accuracy, "kept_groups": int(keep.sum()) // cfg.group_size}
        trained = time.perf_counter()
        if kept:
            metrics |= self.learner.update(kept, advantages, self.step)  # returns floats: the update has finished
            trained = time.perf_counter()
        self.weights = self.sync()
        end = time.perf_counter()
        # The three phases of the step, each ending where its result reached this process.
        metrics |= {"weights_sha256": self.weights, "step_seconds": round(end - start, 4), "generate_seconds": round(generated - start, 4),
                    "train_seconds": round(trained - generated, 4), "sync_seconds": round(end - trained, 4)}
        self.step += 1
        self.history.append(metrics)
        return metrics

    def _replay(self, request_id: int, position: int) -> dict:
        """Replay this step's rollout and scoring with every op traced; name where the token diverges."""
        _, prompts, params = self.requests()
        tracer = Tracer()
        with tracing(tracer):
            completions = self.rollout.generate(prompts, params)
            self.learner.trainer.logprobs([c.prompt + c.token_ids for c in completions], case="trainer_score",
                                          labels=[c.request_id for c in completions])
        return tracer.explain(request_id, position, self.contract)
