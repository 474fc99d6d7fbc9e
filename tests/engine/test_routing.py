"""The experts each sampled token's row was routed to (`EngineConfig.record_routing`): recorded inside
the forward into a buffer, so the padded decode forward of `graphs.py` (a captured CUDA graph on a GPU,
run eagerly here) records the same expert ids as the unpadded engine, one row per generated token
through preemption, and the trainer's ids at the same positions; a control router whose tie order
follows the call size shows the padding does reach them."""

import pytest
import torch

from conftest import bitwise_equal, mutated, preset_dict
from controls import control_dict, tie_gate_rows
from isoexec.contract import Contract, fit_contract
from isoexec.engine import EngineConfig, LLMEngine, SamplingParams
from isoexec.model import PRESETS, init_random
from isoexec.trainer import Trainer

SPEC = PRESETS["tiny-moe"].replace(dtype="float32")
LAYOUTS = {
    "default": dict(),
    "preempt_with_prefix_cache": dict(num_pages=6, max_num_seqs=4, max_num_batched_tokens=64),
}


@pytest.fixture(scope="module")
def model():
    return init_random(SPEC, seed=0)


def graphs_contract(data: dict, spec=SPEC) -> Contract:
    """The contract dict claiming its bits under CUDA graphs (a bitwise contract must), fitted to spec."""
    return fit_contract(mutated(data, lambda d: d["claims"].setdefault("state", {}).update(cuda_graphs=True)), spec)


def requests() -> tuple[list[list[int]], list[SamplingParams]]:
    """Seven prompts of mixed lengths (two sharing two full pages) and max_tokens, so the decode batch
    shrinks through sizes that are no bucket."""
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, SPEC.vocab_size, (n,), generator=g).tolist() for n in (5, 17, 33, 1, 12, 8, 9)]
    prompts[5] = prompts[2][:32] + prompts[5]
    params = [SamplingParams(temperature=1.0, max_tokens=4 + 2 * i, seed=100 + i) for i in range(len(prompts))]
    return prompts, params


def generate(model, contract, cuda_graphs: bool, device="cpu", **overrides):
    """-> completions, engine and the batch size of every padded decode step."""
    settings = {"num_pages": 64, "prefill_chunk_size": 2048, "record_routing": True, **overrides}
    engine = LLMEngine(model, contract, EngineConfig.from_contract(contract, cuda_graphs=cuda_graphs, **settings), device=device)
    padded_steps = []
    if engine.runner.decode_graphs is not None:
        graphs = engine.runner.decode_graphs
        run = graphs.run
        graphs.run = lambda input_ids, *rest: padded_steps.append(len(input_ids)) or run(input_ids, *rest)
    prompts, params = requests()
    return engine.generate(prompts, params, progress=False), engine, padded_steps


@pytest.mark.parametrize("layout", LAYOUTS)
def test_padded_decode_records_the_eager_routing_and_the_trainers(model, layout):
    contract = graphs_contract(preset_dict("tiny-moe"))
    eager, _, _ = generate(model, contract, cuda_graphs=False, **LAYOUTS[layout])
    padded, engine, padded_steps = generate(model, contract, cuda_graphs=True, **LAYOUTS[layout])
    assert any(batch not in engine.runner.decode_graphs.buckets for batch in padded_steps)  # padding did happen
    if layout == "preempt_with_prefix_cache":
        assert engine.stats["preemptions"] > 0 and engine.stats["prefix_cache_hit_tokens"] > 0
    moe_layers = [i for i, layer in enumerate(SPEC.layers) if layer.ffn.kind == "moe"]
    sequences = [c.prompt + c.token_ids for c in eager]
    _, trained = Trainer(model, contract).logprobs(sequences, routing=True)
    for a, b, routing in zip(eager, padded, trained):
        assert a.token_ids == b.token_ids and bitwise_equal(a.logprobs, b.logprobs)
        assert a.routing.shape == (len(a.token_ids), SPEC.num_hidden_layers, SPEC.routing_width) and a.routing.dtype == torch.int64
        assert bitwise_equal(a.routing, b.routing)
        assert bitwise_equal(routing[len(a.prompt) - 1 : -1], a.routing)  # the rows the tokens were drawn from
        dense = [i for i in range(SPEC.num_hidden_layers) if i not in moe_layers]
        assert bool((a.routing[:, dense] == -1).all())
        chosen = a.routing[:, moe_layers]  # [n, moe layers, k]
        assert bool(((chosen >= 0) & (chosen < SPEC.layers[moe_layers[0]].ffn.num_experts)).all())
        assert bool((chosen[..., 0] != chosen[..., 1]).all())


def test_routing_only_when_asked_for_and_routed(model):
    contract = graphs_contract(preset_dict("tiny-moe"))
    completions, engine, _ = generate(model, contract, cuda_graphs=True, record_routing=False)
    assert engine.runner.decode_graphs.routing is None and all(c.routing is None for c in completions)
    dense_spec = PRESETS["tiny-dense"].replace(dtype="float32")
    dense = graphs_contract(preset_dict("tiny-dense"), dense_spec)
    completions, _, _ = generate(init_random(dense_spec, seed=0), dense, cuda_graphs=True)
    assert all(c.routing is None for c in completions)
    assert Trainer(init_random(dense_spec, seed=0), dense).logprobs([[1, 2, 3]], routing=True)[1] == [None]


def test_the_control_router_shows_the_padding_in_the_routing():
    """`controls.reversed_scan_moe_router` with small_rows 6 breaks ties to the higher expert id in calls
    of more than 6 rows: a decode step of 5 or 6 sequences padded to its bucket of 8 does, the same step
    unpadded does not. On a model with tied gate rows the recorded routing must show it."""
    tied = tie_gate_rows(init_random(SPEC, seed=0))
    contract = fit_contract(Contract.from_dict(control_dict("moe.router", preset="tiny-moe", small_rows=6)), SPEC)
    eager, _, _ = generate(tied, contract, cuda_graphs=False)
    padded, _, padded_steps = generate(tied, contract, cuda_graphs=True)
    assert {5, 6} & set(padded_steps)
    assert any(not bitwise_equal(a.routing, b.routing) for a, b in zip(eager, padded))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_graphs_record_the_eager_routing():
    """On a GPU: the decode buckets captured as CUDA graphs write their expert ids into the static
    routing buffer on replay, the same ids the eager engine records, token for token (tiny-moe-triton:
    every op of its decode forward can be captured)."""
    spec = PRESETS["tiny-moe"]
    cuda_model = init_random(spec, seed=0).to("cuda")
    contract = graphs_contract(preset_dict("tiny-moe-triton"), spec)
    eager, _, _ = generate(cuda_model, contract, cuda_graphs=False, device="cuda")
    replayed, engine, padded_steps = generate(cuda_model, contract, cuda_graphs=True, device="cuda")
    graphs = engine.runner.decode_graphs
    assert sorted(graphs.graphs) == list(graphs.buckets) and any(batch not in graphs.buckets for batch in padded_steps)
    for a, b in zip(eager, replayed):
        assert a.token_ids == b.token_ids and bitwise_equal(a.logprobs, b.logprobs)
        assert bitwise_equal(a.routing, b.routing)
