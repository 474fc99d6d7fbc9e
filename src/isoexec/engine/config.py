"""The engine's knobs and a request's sampling parameters: typed dataclasses validated on construction."""

import dataclasses
from dataclasses import dataclass

from ..contract.schema import Contract

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
ENGINE_CASES = ("engine_prefill", "engine_decode")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    num_pages: int
    """Pages in the paged KV cache (each holds `kv_page_size` tokens of every layer)."""
    kv_page_size: int = 16
    prefill_chunk_size: int = 256
    """Most prompt tokens one sequence prefills in one step (a chunk may end at any token)."""
    max_num_seqs: int = 64
    """Most sequences running at once (prefilling or decoding)."""
    max_num_batched_tokens: int = 2048
    """Most tokens (prefill chunks + decodes) one step computes."""
    prefix_caching: bool = True
    cuda_graphs: bool = False
    """Run each decode step padded to a batch-size bucket, as a CUDA graph on a GPU (see graphs.py)."""
    max_model_len: int | None = None
    """Most tokens (prompt + generated) one sequence may hold; longer requests are refused. None: the
    model's max_position_embeddings. With cuda_graphs it is also the width of the decode graphs' slot
    table, which an op may scan whole (native attention does)."""
    record_routing: bool = False
    """Return, with each completion of an MoE model, the experts every MoE layer chose for each sampled
    token's row (`Completion.routing`)."""
    async_scheduling: bool = True
    """Schedule and launch each step before the tokens of the one before it reach the host, whose outputs are
    then processed while the device runs the new step (see llm_engine.py). The rows' bits do not depend on it."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type is int and (not _is_int(value) or value < 1):
                raise ValueError(f"EngineConfig.{f.name}: expected a positive int, got {value!r}")
        if self.max_model_len is not None and not (_is_int(self.max_model_len) and self.max_model_len >= 1):
            raise ValueError(f"EngineConfig.max_model_len: expected None or a positive int, got {self.max_model_len!r}")
        for name in ("prefix_caching", "cuda_graphs", "record_routing", "async_scheduling"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EngineConfig.{name}: expected a bool, got {getattr(self, name)!r}")

    @classmethod
    def from_contract(cls, contract: Contract, num_pages: int, **overrides) -> "EngineConfig":
        """The contract's deployment.engine settings, with `overrides` on top; checked against the contract."""
        engine = contract.deployment.engine
        names = ("kv_page_size", "prefill_chunk_size", "max_num_seqs", "max_num_batched_tokens", "prefix_caching", "cuda_graphs")
        unknown = sorted(set(overrides) - set(names) - {"max_model_len", "record_routing", "async_scheduling"})
        if unknown:
            raise ValueError(f"EngineConfig.from_contract: unknown setting(s) {', '.join(unknown)} "
                             f"(known: {', '.join(names)}, max_model_len, record_routing, async_scheduling)")
        config = cls(num_pages=num_pages, **{**{n: getattr(engine, n) for n in names}, **overrides})
        config.check(contract)
        return config

    def check(self, contract: Contract) -> None:
        """Refuse graphs a bitwise contract does not claim (as the contract refuses them in its deployment)."""
        if self.cuda_graphs and contract.claims.is_bitwise and not contract.claims.state.cuda_graphs:
            raise ValueError(f"EngineConfig.cuda_graphs is on, but contract {contract.name} does not claim its bits under CUDA "
                             "graphs (claims.state.cuda_graphs = false): turn graphs off or use a contract that claims them")


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    """0 samples greedily (the lowest token id attaining the row maximum)."""
    top_k: int = 0
    """0 keeps the whole vocabulary."""
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    """None: derived from the request's index in the `generate` call, so reruns draw the same tokens."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_full_logprobs: bool = False
    """Also return each sampled token's full-vocabulary log-prob row."""

    def filters(self, vocab_size: int) -> bool:
        """Whether a row drawn under these params is cut to its top-k / top-p before the draw (sampling ops sort
        such rows apart from the others)."""
        return self.temperature > 0 and (0 < self.top_k < vocab_size or self.top_p < 1)

    def __post_init__(self):
        number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
        if not (number(self.temperature) and self.temperature >= 0):  # `>=` also refuses NaN
            raise ValueError(f"SamplingParams.temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (_is_int(self.top_k) and self.top_k >= 0):
            raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not (number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not (_is_int(self.max_tokens) and self.max_tokens >= 1):
            raise ValueError(f"SamplingParams.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not (_is_int(self.seed) and INT64_MIN <= self.seed <= INT64_MAX):
            raise ValueError(f"SamplingParams.seed must be None or an int64, got {self.seed!r}")
        is_sequence = isinstance(self.stop_token_ids, (list, tuple))
        stops = tuple(self.stop_token_ids) if is_sequence else ()
        if not is_sequence or not all(_is_int(t) and t >= 0 for t in stops):
            raise ValueError(f"SamplingParams.stop_token_ids must be a list or tuple of token ids (ints >= 0), got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stops)
        for name in ("ignore_eos", "return_full_logprobs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SamplingParams.{name} must be a bool, got {getattr(self, name)!r}")
