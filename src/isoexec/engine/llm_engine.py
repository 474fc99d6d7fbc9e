"""The rollout engine: `generate → step → schedule → launch (run) → resolve`.

Every token's row is computed by contract ops whose bits depend only on the row's own tokens and
absolute position, so batch composition, chunking, prefix-cache hits, preemption and padded CUDA-graph
decode steps change the work done, never the bits (under a bitwise contract; under `native` they
visibly do).

Async scheduling (`EngineConfig.async_scheduling`, on by default): a step is launched on the device and left
in flight; the next step is scheduled and launched before the first one's tokens reach the host, each drawn
token's place held in `Sequence.token_ids` (`PENDING`) and its value fed to the next forward on the device;
then the first step's outputs are read (one device-to-host copy a step) and processed while the device runs
the second. The host's scheduling and bookkeeping thus overlap the device's work instead of adding to it.
The next step waits for the one in flight to resolve first whenever its schedule would read a drawn token
on the host: when a request waits for admission, or a decode would preempt for a page. A sequence that
draws a stop token is computed one step more than it needs; that row is dropped.

Data parallelism (a mesh with `dp` replicas, each a model group): replica d runs the requests i with i mod dp = d,
and every rank returns every completion. Where EP spans the replicas (EP = TP x DP), each MoE layer exchanges pairs
with every replica's ranks, so the replicas step in lockstep: each step they agree which forwards (prefill, decode)
any of them runs, and a replica with nothing of one runs a forward of one padding row instead
(`ModelRunner.idle`), so that every replica's MoE layers meet the same exchanges. A row's bits depend only on its
own tokens, so the split, the padding rows and the lockstep change no bit.
"""

import dataclasses
import logging
import operator

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm.auto import tqdm

from ..contract.schema import Contract
from ..model.spec import RecurrentState
from ..parallel import Mesh
from .config import EngineConfig, SamplingParams
from .model_runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Completion, Sequence

log = logging.getLogger(__name__)

# idle_forwards: padding-row forwards of a replica in lockstep with nothing of a case to run (EP over the replicas).
STATS = ("steps", "overlapped_steps", "prefill_chunks", "prefill_tokens", "decode_tokens", "preemptions", "prefix_cache_hit_tokens",
         "idle_forwards")


class LLMEngine:
    """With a `mesh` of more than one rank, `model` is this rank's shard (`parallel.shard`): every rank of a model
    group runs the same steps on its shard, and every rank's completions are the same (with data parallelism, each
    replica's steps are its own share's; the completions are gathered)."""

    def __init__(self, model, contract: Contract, config: EngineConfig, device: str = "cpu", mesh=None):
        config.check(contract)
        held_on = next(model.parameters()).device
        if held_on.type != torch.device(device).type:
            raise ValueError(f"the model's weights are on {held_on} but the engine runs on {device}: move the model first")
        if config.prefix_caching and any(isinstance(layer.state(), RecurrentState) for layer in model.spec.layers):
            log.warning("prefix caching is off for %s: the state its Gated DeltaNet layers hold after a prefix is not kept per page "
                        "(docs/gdn.md)", model.spec.architecture)
            config = dataclasses.replace(config, prefix_caching=False)
        self.model, self.contract, self.config = model, contract, config
        self.mesh = mesh if mesh is not None else Mesh()  # its sizes go into the engine's fingerprint
        self.runner = ModelRunner(model, contract, config, device, mesh)
        self.binding = self.runner.binding  # what this engine calls: its fingerprint is taken from it
        self.stats = dict.fromkeys(STATS, 0)  # counters over the engine's lifetime
        self.scheduler = Scheduler(config, self.stats)
        self._in_flight: _InFlight | None = None  # the step launched last, until its draws are processed
        self._lockstep = self.mesh.ep_spans_groups  # the replicas' MoE layers exchange pairs: they step together
        self._replicas_busy = True

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 progress: bool = True) -> list[Completion]:
        """One completion per prompt, in prompt order; a bad request gets an "error" completion only."""
        params = _per_prompt(params, len(prompts))
        # A fresh scheduler and a poisoned cache: prefixes cached under earlier weights are never reused.
        self.scheduler = Scheduler(self.config, self.stats)
        self.runner.reset()
        self._in_flight = None
        done, mine = {}, range(self.mesh.dp_rank, len(prompts), self.mesh.dp)  # this replica's share of the requests
        for i in mine:
            prompt, p = prompts[i], params[i]
            tokens, error = self._admissible(prompt, p)
            if error:
                done[i] = Completion.failed(i, prompt, error)
            else:
                self.scheduler.add(Sequence(i, tokens, p, i if p.seed is None else p.seed, self.model.spec.eos_token_id))
        self._replicas_busy = True  # lockstep: until a step's flags say no replica had work at its start
        with tqdm(total=len(mine), initial=len(done), disable=not progress, desc="generate", unit="req") as bar:
            while self._busy():
                for seq in self.step():
                    done[seq.request_id] = seq.completion()
                    bar.update()
        if self._in_flight is not None:  # rows drawn past stop tokens only: nothing stays in flight past generate
            self._resolve()
        if self.mesh.dp > 1:
            done = self._gathered(done)
        return [done[i] for i in range(len(prompts))]

    def _busy(self) -> bool:
        """Whether this replica has requests left; in lockstep, whether any replica had at the last step's start (the
        step's one exchange of flags carries it: the step after the last one runs nothing anywhere and ends the loop)."""
        return self._replicas_busy if self._lockstep else not self.scheduler.is_finished()

    def _any_replica(self, flags: list[bool]) -> list[bool]:
        """Each flag or'd over the replicas: one all-reduce of host values over this rank's peers in the other
        replicas (gloo: over NCCL the read-back would wait for the forward in flight, `Mesh.dp_host_group`)."""
        values = torch.tensor(flags, dtype=torch.int32)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.mesh.dp_host_group)
        return [bool(v) for v in values.tolist()]

    def _gathered(self, done: dict) -> dict:
        """Every replica's completions ({request index: Completion}), host copies crossing pickled."""
        host = {i: dataclasses.replace(c, **{name: None if getattr(c, name) is None else getattr(c, name).cpu()
                                             for name in ("logprobs", "full_logprobs", "routing")}) for i, c in done.items()}
        shares = [None] * self.mesh.dp
        dist.all_gather_object(shares, host, group=self.mesh.dp_mesh.get_group())
        return {i: c for share in shares for i, c in share.items()}

    def step(self) -> list[Sequence]:
        """Schedule and launch the prefill chunks and the decodes as two forwards (one case each); resolve the
        step before, or with async scheduling off this one. -> the sequences that finished."""
        finished = []
        busy = not self.scheduler.is_finished()  # at the step's start, where `_busy` reads it without lockstep
        if self._in_flight is not None and not (self.config.async_scheduling and self.scheduler.can_overlap()):
            finished += self._resolve()
        prefills, decodes = self.scheduler.schedule()
        idle = []  # the cases another replica runs and this one has nothing of (lockstep only)
        if self._lockstep:
            self._replicas_busy, *anywhere = self._any_replica([busy, bool(prefills), bool(decodes)])
            cases = zip(("engine_prefill", "engine_decode"), anywhere, (prefills, decodes))
            idle = [case for case, there, here in cases if there and not here]
        self.stats["idle_forwards"] += len(idle)
        if not prefills and not decodes:
            for case in idle:
                self.runner.idle(case)
            if self._in_flight is None:
                if self._lockstep and self.scheduler.is_finished():
                    return finished  # this replica is done; it ran the others' forwards with padding
                raise RuntimeError("scheduler made no progress (engine bug): nothing running could be scheduled")
            return finished + self._resolve()  # every running sequence's last token is in flight
        launched = self._launch(prefills, decodes, idle)
        if self._in_flight is not None:  # its outputs are read and processed while the device runs `launched`
            self.stats["overlapped_steps"] += 1
            finished += self._resolve()
        self._in_flight = launched
        if not self.config.async_scheduling:
            finished += self._resolve()
        return finished

    def _launch(self, prefills: list[Sequence], decodes: list[Sequence], idle: list[str] = ()) -> "_InFlight":
        """Run both forwards (a padding row's for each case in `idle`) and start copying their draws to the host;
        nothing here waits on the device."""
        flight = self._in_flight  # the inputs still PENDING on the host are its draws
        feed = None if flight is None else (flight.tokens, {id(seq): r for r, (seq, _) in enumerate(flight.drawn)})
        self.stats["steps"] += 1
        self.stats["prefill_chunks"] += len(prefills)
        self.stats["prefill_tokens"] += sum(seq.num_scheduled for seq in prefills)
        self.stats["decode_tokens"] += len(decodes)
        seqs, drawn, outputs = [], [], []
        for case, batch in (("engine_prefill", prefills), ("engine_decode", decodes)):
            if batch:
                outputs.append(self.runner.run(batch, case, feed))
                drawn += self.scheduler.launched(batch)
                seqs += batch
            elif case in idle:
                self.runner.idle(case)
        tokens, logprobs, rows = (_cat([getattr(out, name) for out in outputs]) for name in ("tokens", "logprobs", "rows"))
        routing = [out.routing for out in outputs if out.routing is not None]
        routing = _cat(routing) if routing else None
        host = torch.stack([tokens, logprobs.view(torch.int32).long()])  # [2, R]: the log-probs' bits ride as integers
        done = None
        if host.is_cuda:
            host = host.to("cpu", non_blocking=True)  # into pinned memory, in stream order
            routing = None if routing is None else routing.to("cpu", non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        return _InFlight(seqs, drawn, tokens, rows, host, routing, done)

    def _resolve(self) -> list[Sequence]:
        """Wait for the step in flight to reach the host and process its draws. -> the sequences that finished."""
        flight, self._in_flight = self._in_flight, None
        if flight.done is not None:
            flight.done.synchronize()
        logprobs = flight.host[1].to(torch.int32).view(torch.float32)  # [R]
        return self.scheduler.resolve(flight.seqs, flight.drawn, flight.host[0].tolist(), logprobs, flight.rows, flight.routing)

    def _admissible(self, prompt, params: SamplingParams) -> tuple[list[int], str | None]:
        """(token ids, None), or (_, why this request cannot run)."""
        spec, config = self.model.spec, self.config
        try:
            tokens = [operator.index(t) for t in prompt]
        except TypeError:
            return [], f"prompt must be a sequence of int token ids, got {type(prompt).__name__}"
        if not tokens:
            return tokens, "empty prompt: there is no position to compute the first token's row from"
        bad = next((i for i, t in enumerate(tokens) if not 0 <= t < spec.vocab_size), None)
        if bad is not None:
            return tokens, f"prompt token {tokens[bad]} at index {bad} is outside the vocabulary [0, {spec.vocab_size})"
        if len(tokens) + params.max_tokens > spec.max_position_embeddings:
            return tokens, (f"prompt of {len(tokens)} tokens + max_tokens {params.max_tokens} exceeds "
                            f"max_position_embeddings {spec.max_position_embeddings}")
        if config.max_model_len is not None and len(tokens) + params.max_tokens > config.max_model_len:
            return tokens, (f"prompt of {len(tokens)} tokens + max_tokens {params.max_tokens} exceeds "
                            f"the engine's max_model_len {config.max_model_len}")
        # The last drawn token's keys are never computed, hence the - 1.
        pages = -(-(len(tokens) + params.max_tokens - 1) // config.kv_page_size)
        if pages > config.num_pages:
            return tokens, (f"prompt of {len(tokens)} tokens + max_tokens {params.max_tokens} needs up to {pages} KV pages "
                            f"of {config.kv_page_size} tokens; the whole cache has {config.num_pages}")
        return tokens, None


@dataclasses.dataclass
class _InFlight:
    """A launched step: its sequences, the place of each token it draws, and its draws on their way to the host."""

    seqs: list[Sequence]
    drawn: list[tuple[Sequence, int]]  # (sequence, index in its token_ids), in row order
    tokens: Tensor  # [R] int64 on the device, where the next step's forward reads its PENDING inputs
    rows: Tensor  # [R, V] float32 on the device
    host: Tensor  # [2, R] int64 on the host once `done`: tokens, and the log-probs' float32 bits
    routing: Tensor | None  # [R, layers, k] int64 on the host once `done`, or None
    done: "torch.cuda.Event | None"  # None on the CPU, where the copies are done when made


def _cat(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _per_prompt(params, num_prompts: int) -> list[SamplingParams]:
    params = [params] * num_prompts if isinstance(params, SamplingParams) else list(params)
    if len(params) != num_prompts:
        raise ValueError(f"generate: {num_prompts} prompts but {len(params)} SamplingParams")
    if not all(isinstance(p, SamplingParams) for p in params):
        raise TypeError("generate: params must be a SamplingParams or a list of them, one per prompt")
    return params
