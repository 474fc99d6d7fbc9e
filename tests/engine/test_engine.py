"""The engine's tokens, sampled log-probs and full-vocabulary rows are the same bits whatever the
batch, the chunking, the prefix cache or preemption did — under a bitwise contract, and visibly not
under a control whose linear is batch-dependent by construction — and equal the trainer's forward over
the same tokens."""

import pytest
import torch

from isoexec.contract import load_preset
from isoexec.engine import Completion, EngineConfig, LLMEngine, SamplingParams
from isoexec.model import PRESETS, PackedBatch, Step, init_random, packed_state, step
from isoexec.contract import fit_contract
from isoexec.runtime.binding import bind
from conftest import bitwise_equal
from controls import control_contract

SHARED = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(7)).tolist()


def _prompts() -> list[list[int]]:
    """Shared 40-token prefixes (two full pages), a duplicate, prompts ending near a page boundary (so
    decode crosses one), a one-token prompt and one spanning several chunks."""
    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(0, 512, (n,), generator=g).tolist()  # noqa: E731
    prompts = [SHARED + rand(9), rand(14), SHARED + rand(3), rand(70), [17], SHARED + rand(21), rand(31)]
    return prompts + [list(prompts[0])]


PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=8, return_full_logprobs=True),
    SamplingParams(temperature=0.8, top_k=20, max_tokens=9, seed=11, return_full_logprobs=True),
    SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, seed=12, return_full_logprobs=True),
    SamplingParams(temperature=0.7, top_k=50, top_p=0.8, max_tokens=7, seed=13, return_full_logprobs=True),
    SamplingParams(temperature=1.3, max_tokens=8, seed=14, return_full_logprobs=True),
    SamplingParams(temperature=0.0, max_tokens=6, return_full_logprobs=True),
    SamplingParams(temperature=0.9, top_k=5, max_tokens=10, seed=15, return_full_logprobs=True),
    SamplingParams(temperature=1.0, max_tokens=8, seed=16, return_full_logprobs=True),
]

# Engine layouts that change the work done (batches, chunks, cache hits, preemptions), never the bits.
LAYOUTS = {
    "chunk16": dict(prefill_chunk_size=16),
    "chunk32": dict(prefill_chunk_size=32),
    # Chunks and pages that start inside the contract's attention key blocks (block_n = 16): a row's
    # bits do not depend on where its chunk starts, so the engine may cut wherever its budget ends.
    "chunk7": dict(prefill_chunk_size=7),
    "chunk_cut_by_the_token_budget": dict(max_num_batched_tokens=37),
    "pages_of_8": dict(kv_page_size=8, num_pages=128, prefill_chunk_size=13),
    "no_prefix_cache": dict(prefix_caching=False),
    "one_at_a_time": dict(max_num_seqs=1, prefill_chunk_size=32),
    "staggered_prefix_hits": dict(max_num_batched_tokens=48, prefill_chunk_size=16),
    "preempt": dict(num_pages=8, prefix_caching=False),
    "preempt_with_prefix_cache": dict(num_pages=8, max_num_seqs=4, max_num_batched_tokens=64),
    # Every other run schedules each step before the last one's tokens reach the host (the default).
    "steps_one_at_a_time": dict(async_scheduling=False),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The tiny model's ops are too small for intra-op threads to pay off; on a small shared CPU the
    threads only spin against other work. Bits do not depend on it (every row's op order is fixed)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def setup(contract_name: str, dtype: str):
    """`contract_name` is a preset, or "control" for `controls.control_contract("linear")`."""
    spec = PRESETS["tiny-dense"].replace(dtype=dtype)
    contract = control_contract("linear") if contract_name == "control" else load_preset(contract_name)
    return init_random(spec, seed=0), fit_contract(contract, spec)


def generate(model, contract, prompts=None, params=PARAMS, **overrides):
    settings = {"num_pages": 64, "prefill_chunk_size": 2048, **overrides}  # default: whole prompts in one chunk
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, **settings))
    return engine.generate(_prompts() if prompts is None else prompts, params, progress=False), engine.stats


def same_bits(a: Completion, b: Completion) -> bool:
    return a.token_ids == b.token_ids and bitwise_equal(a.logprobs, b.logprobs) and bitwise_equal(a.full_logprobs, b.full_logprobs)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def reference(request):
    model, contract = setup("tiny-dense", request.param)
    baseline, stats = generate(model, contract)
    return model, contract, baseline, stats


def test_baseline_is_complete_and_self_consistent(reference):
    model, contract, baseline, stats = reference
    assert stats["preemptions"] == 0 and stats["prefill_chunks"] == len(PARAMS)
    sample = bind(contract, model.spec, "engine_decode").ops["engine_decode"]["sample"]
    for i, (c, p) in enumerate(zip(baseline, PARAMS)):
        # token j was drawn from row j with the request's seed at the position it occupies
        n = len(c.token_ids)
        redrawn = sample(c.full_logprobs, torch.full((n,), p.temperature), torch.full((n,), p.top_k), torch.full((n,), p.top_p),
                         torch.full((n,), i if p.seed is None else p.seed), torch.arange(n) + len(c.prompt))
        assert redrawn.tolist() == c.token_ids
        assert c.finish_reason == "length" and len(c.token_ids) == p.max_tokens and c.error is None
        assert c.logprobs.dtype == torch.float32 and c.full_logprobs.shape == (p.max_tokens, 512)
        assert bool(torch.isfinite(c.full_logprobs).all())  # no NaN-poisoned cache slot was read
        assert bitwise_equal(c.logprobs, c.full_logprobs.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0])
        if p.temperature == 0:
            assert c.token_ids == c.full_logprobs.argmax(-1).tolist()


def test_alone_equals_among_many(reference):
    model, contract, baseline, _ = reference
    for prompt, params, expected in zip(_prompts(), PARAMS, baseline):
        (alone,), _ = generate(model, contract, [prompt], params)
        assert same_bits(alone, expected)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_does_not_change_bits(reference, layout):
    model, contract, baseline, _ = reference
    completions, stats = generate(model, contract, **LAYOUTS[layout])
    assert all(same_bits(c, e) for c, e in zip(completions, baseline))
    if layout.startswith("preempt"):
        assert stats["preemptions"] > 0
    if layout in ("staggered_prefix_hits", "preempt_with_prefix_cache"):
        assert stats["prefix_cache_hit_tokens"] > 0
    if layout.startswith("chunk"):
        assert stats["prefill_chunks"] > len(PARAMS)


def test_engine_rows_equal_trainer_forward(reference):
    """The point of it all: the trainer scoring prompt + completion gets the engine's rows, bit for bit."""
    model, contract, baseline, _ = reference
    ops = bind(contract, model.spec, "trainer_score").ops["trainer_score"]
    texts = [c.prompt + c.token_ids[:-1] for c in baseline]
    batch = PackedBatch.of([len(t) for t in texts], "cpu")
    with torch.no_grad(), step(Step(case="trainer_score", ops=ops, batch=batch, state=packed_state(model.spec))):
        hidden = model(torch.tensor(sum(texts, [])), batch.positions)  # [T, hidden]
        for b, c in enumerate(baseline):
            first = int(batch.cu_seqlens[b]) + len(c.prompt) - 1  # the row the first token was drawn from
            assert bitwise_equal(model.logprobs(hidden[first : first + len(c.token_ids)]), c.full_logprobs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_control_shows_the_difference(dtype):
    """The same comparisons must fail somewhere on a batch-dependent path, or they prove nothing: a
    prompt prefilled alone takes the control's small-call reduction order, in a batch the other one.
    (Native is no control: whether its bits change with the batch depends on the CPU and the library.)"""
    model, contract = setup("control", dtype)
    baseline, _ = generate(model, contract)
    alone = [generate(model, contract, [p], q)[0][0] for p, q in zip(_prompts(), PARAMS)]
    chunked, _ = generate(model, contract, prefill_chunk_size=16)
    differs = [not same_bits(a, e) for runs in (alone, chunked) for a, e in zip(runs, baseline)]
    assert any(differs)


@pytest.mark.parametrize("contract_name", ["tiny-dense", "control"])
def test_async_scheduling_draws_past_a_stop_and_drops_the_row(contract_name):
    """With async scheduling the step after a stop token is scheduled before the stop is seen on the host: the
    stopped request is computed once more beside the others and that row dropped. The others' bits do not move;
    under the control they must: its linear takes another order for a call of 2 rows than of 1
    (small_rows = 1), and the request still decoding shares that step with the stopped one's extra row only
    under async scheduling."""
    model, contract = setup("tiny-dense", "float32")
    if contract_name == "control":
        contract = fit_contract(control_contract("linear", small_rows=1), model.spec)
    prompts, params = _prompts()[:2], [PARAMS[0], SamplingParams(**{**PARAMS[4].__dict__, "max_tokens": 10})]
    (full, _), _ = generate(model, contract, prompts, params, async_scheduling=False)
    stopping = [SamplingParams(**{**params[0].__dict__, "stop_token_ids": (full.token_ids[2],)}), params[1]]
    one_at_a_time, sync_stats = generate(model, contract, prompts, stopping, async_scheduling=False)
    overlapped, async_stats = generate(model, contract, prompts, stopping)
    end = full.token_ids.index(full.token_ids[2]) + 1
    assert overlapped[0].finish_reason == "stop" and overlapped[0].token_ids == full.token_ids[:end]
    assert same_bits(overlapped[0], one_at_a_time[0])
    assert sync_stats["overlapped_steps"] == 0 and async_stats["overlapped_steps"] > 0
    assert async_stats["decode_tokens"] == sync_stats["decode_tokens"] + 1  # the stopped request's extra row
    assert same_bits(overlapped[1], one_at_a_time[1]) == (contract_name != "control")


def test_seed_none_derives_from_request_index(reference):
    model, contract, _, _ = reference
    prompts = _prompts()[:3]
    derived = SamplingParams(temperature=1.0, max_tokens=5)
    first, _ = generate(model, contract, prompts, derived)
    again, _ = generate(model, contract, prompts, derived)
    explicit, _ = generate(model, contract, prompts, [SamplingParams(temperature=1.0, max_tokens=5, seed=i) for i in range(3)])
    assert [c.token_ids for c in first] == [c.token_ids for c in again] == [c.token_ids for c in explicit]
    assert all(bitwise_equal(a.logprobs, b.logprobs) for a, b in zip(first, explicit))
    assert first[0].full_logprobs is None


def test_stop_tokens_and_eos(reference):
    model, contract, baseline, _ = reference
    prompt, params, full = _prompts()[0], PARAMS[0], baseline[0]
    stop = full.token_ids[3]
    end = full.token_ids.index(stop) + 1
    (stopped,), _ = generate(model, contract, [prompt], SamplingParams(**{**params.__dict__, "stop_token_ids": (stop,)}))
    assert stopped.finish_reason == "stop" and stopped.token_ids == full.token_ids[:end]
    assert bitwise_equal(stopped.logprobs, full.logprobs[:end])
    eos_model = init_random(model.spec.replace(eos_token_id=stop), seed=0)
    (at_eos,), _ = generate(eos_model, contract, [prompt], params)
    (ignored,), _ = generate(eos_model, contract, [prompt], SamplingParams(**{**params.__dict__, "ignore_eos": True}))
    assert at_eos.finish_reason == "stop" and at_eos.token_ids == full.token_ids[:end]
    assert ignored.finish_reason == "length" and same_bits(ignored, full)


def test_bad_requests_fail_alone():
    model, contract = setup("tiny-dense", "bfloat16")
    good = _prompts()[:2]
    bad = {
        "empty prompt": [],
        "outside the vocabulary": [3, -1, 4],
        "outside the vocabulary [0, 512)": [5, 512],
        "max_position_embeddings": [1] * 2040,
        "KV pages": [2] * 100,
        "sequence of int token ids": ["a", "b"],
    }
    prompts = [good[0], *bad.values(), good[1]]
    params = [PARAMS[0], *[SamplingParams(max_tokens=16)] * len(bad), PARAMS[1]]
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, num_pages=6))
    completions = engine.generate(prompts, params, progress=True)
    expected, _ = generate(model, contract, good, [PARAMS[0], PARAMS[1]], num_pages=6)
    assert [c.request_id for c in completions] == list(range(len(prompts)))
    for c, message in zip(completions[1:-1], bad):
        assert c.finish_reason == "error" and message in c.error and c.token_ids == [] and c.logprobs.numel() == 0
    assert same_bits(completions[0], expected[0]) and same_bits(completions[-1], expected[1])


@pytest.mark.parametrize("bad", [
    dict(max_tokens=0), dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.5),
    dict(top_k=-1), dict(seed=1 << 63), dict(stop_token_ids=5), dict(max_tokens=2.0),
])
def test_sampling_params_refuse_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_config_takes_any_chunk_and_page_size_and_refuses_bad_settings():
    contract = fit_contract(load_preset("tiny-dense"), PRESETS["tiny-dense"])
    for overrides in (dict(kv_page_size=8), dict(prefill_chunk_size=24), dict(max_num_batched_tokens=8)):
        EngineConfig.from_contract(contract, **{"num_pages": 8, **overrides})
    for overrides, message in ((dict(num_pages=0), "num_pages"), (dict(prefill_chunk_size=0), "prefill_chunk_size"),
                               (dict(page_size=16), "unknown")):
        with pytest.raises(ValueError, match=message):
            EngineConfig.from_contract(contract, **{"num_pages": 8, **overrides})
