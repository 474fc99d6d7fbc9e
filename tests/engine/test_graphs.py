"""Decode steps padded to batch-size buckets (CUDA graphs on a GPU, the same padded forward run eagerly
on the CPU) give the same tokens and full-vocabulary rows, bit for bit, as the unpadded engine — under
a bitwise contract, and visibly not under a control whose linear is batch-dependent by construction;
padded rows stay on the scratch page."""

import pytest
import torch

from isoexec.contract import Contract, load_preset
from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
from isoexec.engine.graphs import DecodeGraphs, decode_buckets
from isoexec.model import PRESETS, ModelSpec, init_random, tracing
from isoexec.contract import fit_contract
from isoexec.ops.attention.metadata import UNUSED_SLOT
from conftest import bitwise_equal, int_view, mutated, preset_dict
from controls import control_contract

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def same_bits(a, b) -> bool:
    return a.token_ids == b.token_ids and bitwise_equal(a.logprobs, b.logprobs) and bitwise_equal(a.full_logprobs, b.full_logprobs)


def graphs_contract(name: str, spec: ModelSpec, **decode_domain) -> Contract:
    """The preset with claims.state.cuda_graphs (a bitwise contract must claim them) fitted to spec."""
    def edit(data):
        data["claims"].setdefault("state", {})["cuda_graphs"] = True
        data["cases"]["engine_decode"]["shape_domain"].update(decode_domain)
    return fit_contract(mutated(preset_dict(name), edit), spec)


def setup(contract_name: str, dtype: str, **decode_domain):
    spec = PRESETS["tiny-dense"].replace(dtype=dtype)
    return init_random(spec, seed=0), graphs_contract(contract_name, spec, **decode_domain)


def requests(num: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of mixed lengths (some crossing a page during decode, two sharing a prefix) and different
    max_tokens, so the decode batch shrinks through sizes that are not powers of two."""
    g = torch.Generator().manual_seed(num)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 17, 33, 1, 12, 8, 9)][:num]
    if num > 5:
        prompts[5] = prompts[2][:32] + prompts[5]  # two full pages shared with prompt 2
    params = [SamplingParams(temperature=1.0, max_tokens=4 + 2 * i, seed=100 + i, return_full_logprobs=True) for i in range(num)]
    return prompts, params


class Recorder:
    """Wraps an engine's DecodeGraphs.run: logs (batch, bucket) of every padded step and checks that the
    padded rows addressed only the scratch page, real rows had UNUSED_SLOT past their keys, and the
    forward wrote no cache slot but the step's own and the scratch page's, and no sequence's slot lies
    on the scratch page. With poison_scratch, NaN fills the scratch page before each step."""

    def __init__(self, engine: LLMEngine, poison_scratch: bool = False):
        self.graphs, self.runner, self.poison_scratch = engine.runner.decode_graphs, engine.runner, poison_scratch
        self.stores = [store for store in engine.runner.state if store is not None]  # each layer's keys and values
        self.scratch = range(self.graphs.scratch_slot, self.stores[0].k.shape[0])
        self.steps: list[tuple[int, int]] = []
        self.run, self.graphs.run = self.graphs.run, self.checked_run

    def cache(self):
        """[2, layers, slots, Hkv, D] integer view of every layer's keys and values."""
        return int_view(torch.stack([torch.stack([store.k for store in self.stores]), torch.stack([store.v for store in self.stores])]))

    def checked_run(self, input_ids, positions, write_slots, slot_table, state_ids=None):
        graphs = self.graphs
        if self.poison_scratch:
            for store in self.stores:
                store.k[self.scratch.start :].fill_(float("nan"))
                store.v[self.scratch.start :].fill_(float("nan"))
        before = self.cache().clone()
        num_seqs, num_keys = slot_table.shape
        eager_sizes, forward = [], graphs._forward
        graphs._forward = lambda bucket: eager_sizes.append(bucket) or forward(bucket)
        try:
            rows = self.run(input_ids, positions, write_slots, slot_table, state_ids)
        finally:
            del graphs._forward
        # A replayed graph runs no Python, so on a GPU the bucket is the smallest one that fits.
        bucket = eager_sizes[0] if eager_sizes else min(b for b in graphs.buckets if b >= num_seqs)
        self.steps.append((num_seqs, bucket))
        after = self.cache()
        written = (after != before).flatten(3).any(-1).any(1).any(0).nonzero().flatten().tolist()  # cache slots
        assert not set(write_slots.tolist()) & set(self.scratch), "a sequence was given the scratch page"
        allowed = set(write_slots.tolist()) | set(self.scratch)
        assert set(written) <= allowed, f"decode wrote cache slots {sorted(set(written) - allowed)} outside its own and the scratch page"
        assert bool((graphs.slot_table[num_seqs:bucket] == graphs.scratch_slot).all())
        assert bool((graphs.write_slots[num_seqs:bucket] == graphs.scratch_slot).all())
        assert bool((graphs.positions[num_seqs:bucket] == 0).all())
        assert bool((graphs.slot_table[:num_seqs, num_keys:] == UNUSED_SLOT).all())
        return rows


def generate(model, contract, prompts, params, cuda_graphs: bool, recorder=None, device="cpu", **overrides):
    settings = {"num_pages": 64, "prefill_chunk_size": 2048, **overrides}
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, cuda_graphs=cuda_graphs, **settings), device=device)
    recorded = recorder(engine) if recorder else None
    return engine.generate(prompts, params, progress=False), engine, recorded


@pytest.mark.parametrize("max_num_seqs,expected", [
    (1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (4, (1, 2, 4)), (6, (1, 2, 4, 6)),
    (64, (1, 2, 4, 8, 16, 32, 64)), (100, (1, 2, 4, 8, 16, 32, 64, 100)),
])
def test_buckets_are_powers_of_two_then_max_num_seqs(max_num_seqs, expected):
    assert decode_buckets(max_num_seqs) == expected


LAYOUTS = {
    "default": dict(),
    "last_bucket_not_a_power_of_two": dict(max_num_seqs=6),
    "preempt_with_prefix_cache": dict(num_pages=6, max_num_seqs=4, max_num_batched_tokens=64),  # and a narrow slot table
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_padded_decode_is_bitwise_neutral(dtype, layout):
    model, contract = setup("tiny-dense", dtype)
    stats = dict.fromkeys(("preemptions", "prefix_cache_hit_tokens"), 0)
    for num in (3, 5, 7):
        prompts, params = requests(num)
        eager, _, _ = generate(model, contract, prompts, params, cuda_graphs=False, **LAYOUTS[layout])
        padded, engine, recorded = generate(model, contract, prompts, params, cuda_graphs=True, recorder=Recorder, **LAYOUTS[layout])
        assert all(same_bits(a, b) for a, b in zip(eager, padded))
        assert all(bool(torch.isfinite(c.full_logprobs).all()) for c in padded)
        assert any(batch < bucket for batch, bucket in recorded.steps)  # padding did happen
        assert all(bucket == min(b for b in engine.runner.decode_graphs.buckets if b >= batch) for batch, bucket in recorded.steps)
        stats = {k: v + engine.stats[k] for k, v in stats.items()}
    if layout == "preempt_with_prefix_cache":
        assert stats["preemptions"] > 0 and stats["prefix_cache_hit_tokens"] > 0


def test_real_rows_never_read_the_scratch_page():
    """NaN in the scratch page before every decode step: a real row that read it would turn NaN."""
    model, contract = setup("tiny-dense", "bfloat16")
    prompts, params = requests(7)
    eager, _, _ = generate(model, contract, prompts, params, cuda_graphs=False)
    padded, _, recorded = generate(model, contract, prompts, params, cuda_graphs=True, recorder=lambda e: Recorder(e, poison_scratch=True))
    assert recorded.steps and all(same_bits(a, b) for a, b in zip(eager, padded))


def test_scratch_page_is_never_handed_out():
    model, contract = setup("tiny-dense", "bfloat16")
    prompts, params = requests(7)
    _, engine, _ = generate(model, contract, prompts, params, cuda_graphs=True, num_pages=10)
    _, plain, _ = generate(model, contract, prompts, params, cuda_graphs=False, num_pages=10)
    manager, page_size = engine.scheduler.block_manager, engine.config.kv_page_size
    assert len(manager.pages) == len(plain.scheduler.block_manager.pages) == 10
    assert manager.num_free == 10  # every page handed back, none of them the scratch page
    assert engine.runner.state[0].k.shape[0] == (10 + 1) * page_size and plain.runner.state[0].k.shape[0] == 10 * page_size
    assert engine.runner.decode_graphs.scratch_slot == 10 * page_size


def test_steps_past_the_decode_shape_domain_run_eagerly():
    """The slot table is only as wide as the contract's engine_decode max_seq_len; longer rows fall
    back to the unpadded forward, with the same bits."""
    model, contract = setup("tiny-dense", "float32", max_seq_len=32)
    prompts, params = requests(7)
    eager, _, _ = generate(model, contract, prompts, params, cuda_graphs=False)
    padded, engine, recorded = generate(model, contract, prompts, params, cuda_graphs=True, recorder=Recorder)
    assert engine.runner.decode_graphs.max_num_keys == 32
    num_decode_rows = sum(len(c.token_ids) - 1 for c in padded)  # the first token comes from the prefill
    assert 0 < sum(batch for batch, _ in recorded.steps) < num_decode_rows
    assert all(same_bits(a, b) for a, b in zip(eager, padded))


def test_max_model_len_bounds_requests_and_the_graph_table():
    """max_model_len refuses longer requests (the others still run) and narrows the decode graphs' slot
    table; the bits stay those of the engine without it."""
    model, contract = setup("tiny-dense", "float32")
    prompts, params = requests(5)
    longest = max(len(p) + q.max_tokens for p, q in zip(prompts, params))
    eager, _, _ = generate(model, contract, prompts, params, cuda_graphs=False)
    narrow, engine, _ = generate(model, contract, prompts, params, cuda_graphs=True, max_model_len=longest)
    assert engine.runner.decode_graphs.max_num_keys == longest
    assert all(same_bits(a, b) for a, b in zip(eager, narrow))
    too_long, _, _ = generate(model, contract, prompts, params, cuda_graphs=True, max_model_len=longest - 1)
    refused = [c for c in too_long if c.error]
    assert len(refused) == 1 and f"max_model_len {longest - 1}" in refused[0].error
    with pytest.raises(ValueError, match="max_model_len: expected None or a positive int"):
        EngineConfig.from_contract(contract, num_pages=8, max_model_len=0)


class PassThrough:
    def wrap(self, ops: dict, case: str) -> dict:
        return ops


def test_tracing_runs_the_unpadded_forward():
    model, contract = setup("tiny-dense", "bfloat16")
    prompts, params = requests(5)
    eager, _, _ = generate(model, contract, prompts, params, cuda_graphs=False)
    settings = EngineConfig.from_contract(contract, num_pages=64, cuda_graphs=True)
    engine = LLMEngine(model, contract, settings)
    recorded = Recorder(engine)
    with tracing(PassThrough()):
        traced = engine.generate(prompts, params, progress=False)
    assert recorded.steps == [] and all(same_bits(a, b) for a, b in zip(eager, traced))


def test_graphs_refused_without_the_claim():
    spec = PRESETS["tiny-dense"]
    contract = fit_contract(load_preset("tiny-dense"), spec)  # claims.state.cuda_graphs = false
    with pytest.raises(ValueError, match="claims.state.cuda_graphs"):
        EngineConfig.from_contract(contract, num_pages=8, cuda_graphs=True)
    with pytest.raises(ValueError, match="claims.state.cuda_graphs"):
        LLMEngine(init_random(spec, seed=0), contract, EngineConfig(num_pages=8, cuda_graphs=True))
    assert EngineConfig.from_contract(contract, num_pages=8).cuda_graphs is False  # the deployment's setting
    native = fit_contract(load_preset("native"), spec)  # claims nothing, so refuses nothing
    assert EngineConfig.from_contract(native, num_pages=8, cuda_graphs=True).cuda_graphs
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineConfig(num_pages=8, cuda_graphs=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_control_shows_the_difference(dtype):
    """The same comparison must fail on a batch-dependent path, or it proves nothing. The control's
    linear (`controls.split_k_linear`) takes one reduction order in calls of up to 6 rows and another in
    larger ones, so a decode step of 5 or 6 sequences padded to its bucket of 8 changes its bits, and so
    does a prompt prefilled alone rather than in the batch. (Native is no control: whether padding or
    batching changes its bits depends on the CPU and the library.)"""
    model = init_random(PRESETS["tiny-dense"].replace(dtype=dtype), seed=0)
    contract = fit_contract(control_contract("linear", small_rows=6), model.spec)
    prompts, params = requests(7)
    eager, _, _ = generate(model, contract, prompts, params, cuda_graphs=False)
    padded, _, recorded = generate(model, contract, prompts, params, cuda_graphs=True, recorder=Recorder)
    alone = [generate(model, contract, [p], q, cuda_graphs=False)[0][0] for p, q in zip(prompts, params)]
    assert any(batch <= 6 < bucket for batch, bucket in recorded.steps)
    assert any(not same_bits(a, b) for a, b in zip(padded, eager))
    assert any(not same_bits(a, b) for a, b in zip(alone, eager))


CUDA_CONTRACTS = ["tiny-dense-triton"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("contract_name", CUDA_CONTRACTS)
def test_captured_graphs_replay_the_eager_bits(contract_name):
    """On a GPU: capture every bucket, replay them, and get the eager engine's bits. A contract whose
    attention syncs with the host (attention.reference) must be refused with a clear error instead."""
    spec = PRESETS["tiny-dense"]
    model = init_random(spec, seed=0).to("cuda")
    contract = graphs_contract(contract_name, spec)
    attention = contract.entry("attention", "engine_decode").impl
    prompts, params = requests(7)
    if attention.id == "attention.reference":
        with pytest.raises(RuntimeError, match=f"(?s)CUDA graph.*{contract.name}.*{attention.id}.*cuda_graphs = false"):
            generate(model, contract, prompts, params, cuda_graphs=True, device="cuda")
        return
    eager, _, _ = generate(model, contract, prompts, params, cuda_graphs=False, device="cuda")
    replayed, engine, recorded = generate(model, contract, prompts, params, cuda_graphs=True, recorder=Recorder, device="cuda")
    graphs = engine.runner.decode_graphs
    assert isinstance(graphs, DecodeGraphs) and sorted(graphs.graphs) == list(graphs.buckets)
    assert any(batch < bucket for batch, bucket in recorded.steps)
    assert all(same_bits(a, b) for a, b in zip(eager, replayed))
