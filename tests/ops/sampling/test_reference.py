import pytest
import torch

from conftest import run_battery

from isoexec.ops.sampling import native, reference
from isoexec.runtime.registry import REGISTRY

CONSTANTS = {"input_dtype": "float32", "compute_dtype": "float32", "noise": "splitmix64", "method": "gumbel_max"}
MASK64 = (1 << 64) - 1


def splitmix64_python(state: int) -> int:
    z = (state + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def requests(rows: int, temperature=1.0, top_k=0, top_p=1.0, seed=None, position=None) -> list[torch.Tensor]:
    """[temperature, top_k, top_p, seed, position] for `rows` rows; scalars are broadcast."""
    def column(value, dtype):
        return value.to(dtype) if isinstance(value, torch.Tensor) else torch.full((rows,), value, dtype=dtype)

    seed = torch.arange(rows) if seed is None else seed
    position = torch.full((rows,), 11) if position is None else position
    return [column(temperature, torch.float32), column(top_k, torch.int64), column(top_p, torch.float32),
            column(seed, torch.int64), column(position, torch.int64)]


def sample(logprobs: torch.Tensor, *rest) -> torch.Tensor:
    return reference.sample(logprobs, *rest, **CONSTANTS)


def draw_many(row: torch.Tensor, num_seeds: int, **settings) -> torch.Tensor:
    """Tokens drawn for one log-probability row under `num_seeds` different seeds."""
    logprobs = row.float().expand(num_seeds, -1).contiguous()
    return sample(logprobs, *requests(num_seeds, **settings))


def log_softmax(values) -> torch.Tensor:
    return torch.log_softmax(torch.tensor(values, dtype=torch.float64), -1).float()


def test_splitmix64_matches_the_published_generator():
    assert reference.splitmix64(torch.tensor([0])).item() & MASK64 == 0xE220A8397B1DCDAF
    g = torch.Generator().manual_seed(0)
    states = torch.randint(-(2**63), 2**63 - 1, (2000,), generator=g)
    ours = [v & MASK64 for v in reference.splitmix64(states).tolist()]
    assert ours == [splitmix64_python(s & MASK64) for s in states.tolist()]


def test_noise_bits_are_a_splitmix64_stream_per_seed_and_position():
    seed, position = torch.tensor([-12345]), torch.tensor([678])
    stream = splitmix64_python(splitmix64_python(-12345 & MASK64) ^ 678)
    expected = [splitmix64_python((stream + v * 0x9E3779B97F4A7C15) & MASK64) for v in range(5)]
    assert [v & MASK64 for v in reference.noise_bits(seed, position, 5)[0].tolist()] == expected


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_uniform_is_exact_and_strictly_inside_the_unit_interval(dtype):
    extremes = torch.tensor([0, -1, 1 << 62, -(1 << 63)])  # all-zero and all-one bit patterns among them
    u = reference.uniform(extremes, dtype)
    assert u.dtype == dtype and bool(((u > 0) & (u < 1)).all())
    g = -torch.log(-torch.log(u))
    assert torch.isfinite(g).all()


def test_greedy_takes_the_lowest_index_among_ties():
    logprobs = torch.tensor([
        [-2.0, -1.0, -1.0, -3.0],
        [-1.5, -1.5, -1.5, -1.5],
        [0.0, -0.0, 0.0, -1.0],
        [-float("inf"), -4.0, -float("inf"), -4.0],
    ])
    for seed in range(5):
        tokens = sample(logprobs, *requests(4, temperature=0.0, seed=torch.full((4,), seed)))
        assert tokens.tolist() == [1, 0, 0, 1]


def test_masked_tokens_are_never_drawn():
    row = log_softmax([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    row[[0, 3, 5]] = -float("inf")
    assert set(draw_many(row, 2000, temperature=2.0).tolist()) == {1, 2, 4}


def test_top_k_keeps_exactly_the_k_largest():
    g = torch.Generator().manual_seed(1)
    row = torch.log_softmax(torch.randn(20, generator=g, dtype=torch.float64), -1).float()
    drawn = set(draw_many(row, 3000, temperature=5.0, top_k=4).tolist())
    assert drawn == set(torch.topk(row, 4).indices.tolist())


def test_top_k_ties_go_to_the_lower_index():
    row = log_softmax([-1.0, 0.0, -1.0, 0.0, 0.0, -2.0, 0.0])
    assert set(draw_many(row, 2000, top_k=2).tolist()) == {1, 3}
    assert set(draw_many(row, 2000, top_k=5).tolist()) == {0, 1, 3, 4, 6}


NUCLEI = [(0.0, {4}), (0.3, {4}), (0.65, {4, 1}), (0.75, {4, 1, 6}), (0.95, {4, 1, 6, 0}), (1.0, {4, 1, 6, 0})]


@pytest.mark.parametrize("top_p, kept", NUCLEI)
def test_top_p_keeps_the_smallest_prefix_reaching_p(top_p, kept):
    probs = [0.1, 0.3, 0.0, 0.0, 0.4, 0.0, 0.2]  # descending: 4 (0.4), 1 (0.3), 6 (0.2), 0 (0.1)
    row = torch.tensor(probs, dtype=torch.float64).log().float()
    assert set(draw_many(row, 3000, top_p=top_p).tolist()) == kept


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    row = torch.tensor([0.1, 0.3, 0.05, 0.05, 0.4, 0.0, 0.1], dtype=torch.float64).log().float()
    # top-2 leaves {4: 4/7, 1: 3/7}; p = 0.5 then keeps only token 4, p = 0.6 both.
    assert set(draw_many(row, 2000, top_k=2, top_p=0.5).tolist()) == {4}
    assert set(draw_many(row, 2000, top_k=2, top_p=0.6).tolist()) == {4, 1}


@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_empirical_distribution_matches_tempered_softmax(temperature):
    row = log_softmax([1.0, 2.0, 0.5, -1.0, 3.0, 2.0, -0.3, 0.0])
    num_seeds = 20000
    counts = torch.bincount(draw_many(row, num_seeds, temperature=temperature), minlength=8).double()
    expected = torch.softmax(row.double() / temperature, -1)
    sigma = (expected * (1 - expected) / num_seeds).sqrt()
    assert bool(((counts / num_seeds - expected).abs() <= 5 * sigma + 1e-3).all()), (counts / num_seeds, expected)


def batch_of_requests(rows: int, width: int):
    g = torch.Generator().manual_seed(2)
    logprobs = torch.log_softmax(torch.randn(rows, width, generator=g, dtype=torch.float64) * 3, -1).float()
    settings = requests(
        rows,
        temperature=torch.tensor([0.0, 0.6, 1.0, 1.7])[torch.arange(rows) % 4],
        top_k=torch.tensor([0, 3, 40, 0, 0])[torch.arange(rows) % 5],
        top_p=torch.tensor([1.0, 0.9, 0.3])[torch.arange(rows) % 3],
        seed=torch.randint(-(2**63), 2**63 - 1, (rows,), generator=g),
        position=torch.randint(0, 4096, (rows,), generator=g),
    )
    return [logprobs, *settings]


def test_same_seed_and_position_draw_the_same_token_alone_and_in_any_batch():
    batched = batch_of_requests(50, 700)
    alone = torch.cat([sample(*[b[i : i + 1] for b in batched]) for i in range(50)])
    g = torch.Generator().manual_seed(3)
    for size in (1, 3, 8, 17, 33, 50):
        for _ in range(3):
            rows = torch.randperm(50, generator=g)[:size]
            assert torch.equal(sample(*[b[rows] for b in batched]), alone[rows]), size
    repeated = torch.arange(50).repeat_interleave(2)  # each request twice, next to itself
    assert torch.equal(sample(*[b[repeated] for b in batched]), alone[repeated])
    assert sample(*[b[:0] for b in batched]).shape == (0,)


def test_degenerate_rows_stay_row_local():
    batched = batch_of_requests(12, 300)
    clean = sample(*batched)
    batched[0][3] = -float("inf")  # fully masked
    batched[0][7, 40] = float("nan")
    batched[1][7] = 0.0  # greedy: the first NaN
    out = sample(*batched)
    assert out[3].item() == 0 and out[7].item() == 40
    rest = torch.tensor([i not in (3, 7) for i in range(12)])
    assert torch.equal(out[rest], clean[rest])
    assert torch.equal(out, torch.cat([sample(*[b[i : i + 1] for b in batched]) for i in range(12)]))


def test_different_positions_and_seeds_give_different_noise():
    noise = reference.gumbel_noise(torch.full((64,), 9), torch.arange(64), 100, torch.float32)  # [64, 100]
    assert len({tuple(row.tolist()) for row in noise}) == 64
    other_seed = reference.gumbel_noise(torch.full((64,), 10), torch.arange(64), 100, torch.float32)
    assert not bool((noise == other_seed).any(-1).all())
    flat = torch.full((400, 50), -torch.tensor(50.0).log().item())
    tokens = sample(flat, *requests(400, seed=torch.full((400,), 9), position=torch.arange(400)))
    assert len(set(tokens.tolist())) > 40


def test_compute_dtype_bfloat16_runs_and_stays_greedy_exact():
    logprobs = torch.tensor([[-3.0, -0.5, -0.5, -2.0], [-1.0, -2.0, -3.0, -0.25]], dtype=torch.bfloat16)
    tokens = reference.sample(logprobs, *requests(2, temperature=torch.tensor([0.0, 1.0])), input_dtype="bfloat16",
                              compute_dtype="bfloat16", noise="splitmix64", method="gumbel_max")
    assert tokens[0].item() == 1 and 0 <= tokens[1].item() < 4


def test_native_sampler_depends_on_the_batch():
    """By construction, on any machine: the batch draws from one stream seeded by its first row, so a
    row's draw depends on which rows come before it."""
    batched = batch_of_requests(32, 700)
    batched[1] = torch.ones(32)  # no greedy rows
    run = lambda *args: native.sample(*args, input_dtype="float32")  # noqa: E731
    alone = torch.cat([run(*[b[i : i + 1] for b in batched]) for i in range(32)])
    assert not torch.equal(run(*batched), alone)


@pytest.mark.parametrize("change", [{"noise": "philox"}, {"method": "inverse_cdf"}])
def test_reference_refuses_noise_and_methods_it_does_not_implement(change):
    impl = REGISTRY.get("sampling.reference", 1)
    with pytest.raises(ValueError):
        impl.check({**CONSTANTS, **change})
    with pytest.raises(ValueError):
        reference.sample(*batch_of_requests(2, 10), **{**CONSTANTS, **change})


def battery(preset: str):
    return run_battery(preset, "sampling", "engine_decode")


def test_battery_admits_the_reference():
    result = battery("tiny-dense")
    assert result.impl == "sampling.reference@1"
    assert result.status == "admitted", result.failures
    assert result.dtypes == ("bfloat16", "float32") and result.trials > 0


def test_battery_rejects_the_native_sampler():
    result = battery("native")
    assert result.impl == "sampling.native@1"
    assert result.status == "rejected"
    assert all("raised" not in failure for failure in result.failures), result.failures[:3]
    assert any("vs alone" in failure for failure in result.failures)


def test_battery_catches_a_sampler_that_rounds_differently_in_big_batches():
    """A reference sampler that rounds its input to bf16 once the batch has 8 rows: only the probe's
    knife-edge rows (near-ties given their own noise) can tell, so without them this passed."""
    from isoexec.contract import load_preset
    from isoexec.ops.sampling import probe
    from isoexec.runtime.registry import Impl, Registry
    from isoexec.validate.battery import validate_entry

    def rounds_when_batched(logprobs, *args, **constants):
        if logprobs.shape[0] >= 8:
            logprobs = logprobs.to(torch.bfloat16).to(logprobs.dtype)
        return reference.sample(logprobs, *args, **constants)

    registry = Registry()
    registry.register(Impl(id="sampling.reference", version=1, region="sampling", cases=frozenset({"engine_prefill", "engine_decode"}),
                           fn=rounds_when_batched, check_constants=reference.check_constants))
    contract = load_preset("tiny-dense")
    result = validate_entry(contract, contract.entry("sampling", "engine_decode"), probe.probe, registry=registry, device=torch.device("cpu"))
    assert result.status == "rejected"
    assert any("float32" in failure for failure in result.failures)
