"""The on-policy RL loop: rollout in the engine, recompute in the trainer, gate, update, sync.

One step: sample prompts (seeded by (seed, step)), generate `group_size` completions per prompt,
score them, normalise advantages within each group, recompute the log-probs of the generated tokens
in `trainer_fwd`, gate them against the rollout's, take `optimizer_steps` AdamW steps, and send the
weights to the engine with a digest check on both sides. Everything a step draws is derived from
(seed, step), so a run resumed from a checkpoint continues bit for bit.

The two sides are `Rollout` and `Learner`; `RLRun` only talks to them through their methods, so the
same loop drives them in this process or as Ray actors (`ray_mode.py`).
"""

import random
import time

import torch

from ..audit.trace import Tracer
from ..contract import load as load_contract
from ..engine import EngineConfig, LLMEngine, SamplingParams
from ..model import DenseModel, ModelSpec, fit_contract, init_random, tracing
from ..runtime import check
from ..trainer import sequence_logprobs
from . import losses
from .config import RLConfig
from .gate import gate
from .handshake import ensure_admitted, side_fingerprint
from .sync import load_state, state_bytes, weights_digest
from .tasks import Task, checks, load_task
from .warmup import warmup


def task_model_spec(task: Task, max_new_tokens: int) -> ModelSpec:
    """A tiny Qwen3-style model sized for the task's alphabet, in float32 for training on a CPU."""
    return ModelSpec(architecture="Qwen3ForCausalLM", vocab_size=task.tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                     rope_theta=10_000.0, max_position_embeddings=64 + max_new_tokens, tie_word_embeddings=True, dtype="float32",
                     eos_token_id=task.tokenizer.EOS)


def request_seed(seed: int, step: int, index: int) -> int:
    return ((seed * 1_000_003 + step) * 65_536 + index) % (1 << 62)


def usable_task(config: RLConfig) -> tuple[Task, str | None]:
    """The config's task, its data checked against the model's length (tasks/checks.py): (task, None),
    or with `skip_bad_examples` (task without the unusable examples, a note of what was dropped)."""
    task = load_task(config.task, config.data)
    length = task_model_spec(task, config.max_new_tokens).max_position_embeddings
    return checks.usable_task(task, max_length=length, max_new_tokens=config.max_new_tokens, skip=config.skip_bad_examples)


def setup(config: RLConfig):
    """What both sides derive from the config alone: the task, the model shape, the fitted contract."""
    task, _ = usable_task(config)
    spec = task_model_spec(task, config.max_new_tokens)
    contract = fit_contract(load_contract(config.contract), spec, profile=f"task:{task.name}")
    return task, spec, contract


class Rollout:
    """The engine side: its own copy of the weights, updated only through `load_weights`."""

    def __init__(self, config: RLConfig):
        _, self.spec, self.contract = setup(config)
        self.model = init_random(self.spec, config.seed)
        page = self.contract.deployment.engine.kv_page_size
        pages = config.prompts_per_step * config.group_size * -(-(16 + config.max_new_tokens) // page)
        self.engine = LLMEngine(self.model, self.contract, EngineConfig.from_contract(self.contract, num_pages=pages + 1))

    def fingerprint(self) -> dict:
        return side_fingerprint(self.contract, "engine", spec=self.spec)

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params, progress=False)

    def load_weights(self, tensors: dict, digest: str) -> str:
        return load_state(self.model, tensors, digest)


class Learner:
    """The trainer side: the policy, its optimiser, the gate and the update."""

    def __init__(self, config: RLConfig, initial: DenseModel | None = None):
        self.config = config
        self.task, self.spec, self.contract = setup(config)
        self.policy = initial if initial is not None else warmup(init_random(self.spec, config.seed), self.task, config)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        self.step = 0  # the RL step being trained on, for reports

    def fingerprint(self) -> dict:
        return side_fingerprint(self.contract, "trainer", spec=self.spec)

    def weights(self) -> tuple[dict, str]:
        return state_bytes(self.policy), weights_digest(self.policy)

    def update(self, kept, advantages: torch.Tensor, step: int) -> dict:
        cfg, self.step = self.config, step
        sequences = [c.prompt + c.token_ids for c in kept]
        rollout_logp = torch.cat([c.logprobs for c in kept])  # [T]
        seq_index = torch.cat([torch.full((len(c.token_ids),), i) for i, c in enumerate(kept)])
        out = {}
        for k in range(cfg.optimizer_steps):
            rows = sequence_logprobs(self.policy, self.contract, sequences, case="trainer_fwd")
            generated = [r[len(c.prompt) - 1 :] for r, c in zip(rows, kept)]
            logp = torch.cat([g.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0] for g, c in zip(generated, kept)])  # [T]
            if k == 0:
                out |= gate(self, kept, generated)
                old = logp.detach() if cfg.truncated_is_cap else rollout_logp
                weights = torch.clamp(torch.exp(old - rollout_logp), max=cfg.truncated_is_cap) if cfg.truncated_is_cap else None
            loss, stats = losses.policy_loss(logp, old, advantages, seq_index, eps_low=cfg.clip_eps_low, eps_high=cfg.eps_high,
                                             aggregation="token" if cfg.algorithm == "dapo" else "sequence", weights=weights)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
            self.optimizer.step()
        return out | {"loss": float(loss.detach()), "grad_norm": float(grad_norm), **stats}

    def trace(self, request_id: int, position: int) -> dict:
        """Needs the engine in this process: set by RLRun for in-process runs."""
        if getattr(self, "replay", None) is None:
            return {"summary": "tracing needs the engine in the trainer's process (not available in Ray mode)"}
        return self.replay(request_id, position)


class RLRun:
    """Drives one Rollout and one Learner (local objects, or Ray actors behind the same methods)."""

    def __init__(self, config: RLConfig, *, initial: DenseModel | None = None, rollout=None, learner=None):
        self.config = config
        self.task, spec, self.contract = setup(config)
        ensure_admitted(self.contract, spec=spec)
        self.learner = learner if learner is not None else Learner(config, initial)
        self.rollout = rollout if rollout is not None else Rollout(config)
        if isinstance(self.learner, Learner) and isinstance(self.rollout, Rollout):
            self.learner.replay = self._replay
        self.verdict = check(self.learner.fingerprint(), self.rollout.fingerprint()).raise_if_refused()
        self.step = 0
        self.history: list[dict] = []
        self.weights = self.sync()

    def sync(self) -> str:
        tensors, digest = self.learner.weights()
        return self.rollout.load_weights(tensors, digest)

    def requests(self):
        cfg, tok = self.config, self.task.tokenizer
        examples = self.task.sample(random.Random(f"{cfg.seed}:{self.step}"), cfg.prompts_per_step)
        prompts = [tok.encode(e.prompt) for e in examples for _ in range(cfg.group_size)]
        params = [SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_new_tokens, seed=request_seed(cfg.seed, self.step, i),
                                 return_full_logprobs=True) for i in range(len(prompts))]
        return examples, prompts, params

    def run_step(self) -> dict:
        cfg, start = self.config, time.perf_counter()
        examples, prompts, params = self.requests()
        completions = self.rollout.generate(prompts, params)
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
        if kept:
            metrics |= self.learner.update(kept, advantages, self.step)
        self.weights = self.sync()
        metrics |= {"weights_sha256": self.weights, "step_seconds": round(time.perf_counter() - start, 4)}
        self.step += 1
        self.history.append(metrics)
        return metrics

    def _replay(self, request_id: int, position: int) -> dict:
        """Replay this step's rollout and scoring with every op traced; name where the token diverges."""
        _, prompts, params = self.requests()
        tracer = Tracer()
        with tracing(tracer):
            completions = self.rollout.generate(prompts, params)
            sequence_logprobs(self.learner.policy, self.contract, [c.prompt + c.token_ids for c in completions], case="trainer_score",
                              labels=[c.request_id for c in completions])
        return tracer.explain(request_id, position, self.contract)
