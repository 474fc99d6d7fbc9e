"""`sampling.reference` draws the same tokens, bit for bit, as the algorithm it was admitted with.

The oracle below is that algorithm written out in full (noise, the balanced-tree reductions, the
log-softmax, top-k, top-p, Gumbel-max), independent of `isoexec`, so a later edit to the sampler or to
the helpers it shares cannot change both sides at once. The sampler skips work the oracle does
(top-k/top-p for rows that keep every token, greedy-only batches, one xorshift, the tree max behind
the argmax); every case here must still give the oracle's tokens, and deliberately broken variants
must not.
"""

import math

import pytest
import torch

from isoexec.ops.sampling import reference

pytestmark = pytest.mark.gpu

INF, NAN = float("inf"), float("nan")
# The oracle runs where the sampler does: elementwise log and exp may round differently on another device.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
INT64 = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _int64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


GAMMA, MIX_1, MIX_2 = _int64(0x9E3779B97F4A7C15), _int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB)
BLOCK = 256


def oracle_shift_right(z, bits):
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def oracle_mix64(z):
    z = (z ^ oracle_shift_right(z, 30)) * MIX_1
    z = (z ^ oracle_shift_right(z, 27)) * MIX_2
    return z ^ oracle_shift_right(z, 31)


def oracle_splitmix64(state):
    return oracle_mix64(state + GAMMA)


def oracle_noise_bits(seed, position, vocab_size):
    stream = oracle_splitmix64(oracle_splitmix64(seed) ^ position)  # [R]
    counter = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seed.device) * GAMMA  # [V]
    return oracle_mix64(stream.unsqueeze(-1) + counter)


def oracle_uniform(bits, dtype):
    mantissa_bits = round(-math.log2(torch.finfo(dtype).eps))
    k = oracle_shift_right(bits, 64 - mantissa_bits)
    return (2 * k + 1).to(dtype) * 2.0 ** -(mantissa_bits + 1)


def oracle_tree(x, combine, identity):
    """Balanced binary tree over the last dim: pad to a power of two, add the upper half onto the lower."""
    width = 1 << (x.shape[-1] - 1).bit_length()
    if width != x.shape[-1]:
        x = torch.cat([x, x.new_full((*x.shape[:-1], width - x.shape[-1]), identity)], dim=-1)
    while width > 1:
        width //= 2
        x = combine(x[..., :width], x[..., width:])
    return x[..., 0]


def oracle_blocked(x, combine, identity):
    """Blocks of BLOCK tokens (the last padded with the identity), a tree inside each, a tree across them."""
    num_blocks = max(1, -(-x.shape[-1] // BLOCK))
    if num_blocks * BLOCK != x.shape[-1]:
        x = torch.cat([x, x.new_full((*x.shape[:-1], num_blocks * BLOCK - x.shape[-1]), identity)], dim=-1)
    blocks = x.reshape(*x.shape[:-1], num_blocks, BLOCK)
    return oracle_tree(oracle_tree(blocks, combine, identity), combine, identity)


def oracle_log_softmax(x):
    row_max = oracle_blocked(x, torch.maximum, -INF).unsqueeze(-1)
    is_empty = row_max == -INF
    shifted = x - torch.where(is_empty, 0.0, row_max)
    total = oracle_blocked(torch.exp(shifted), torch.add, 0.0).unsqueeze(-1)
    return shifted - torch.log(torch.where(is_empty, 1.0, total))


def oracle_first_argmax(x):
    best = oracle_blocked(x, torch.maximum, -INF).unsqueeze(-1)
    is_best = (x == best) | x.isnan()
    index = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(is_best, index, x.shape[-1]).amin(-1)


def oracle_inclusive_prefix_sum(x):
    step = 1
    while step < x.shape[-1]:
        x = torch.cat([x[..., :step], x[..., step:] + x[..., :-step]], dim=-1)
        step *= 2
    return x


def oracle_sample_rows(x, temperature, top_k, top_p, seed, position):
    vocab_size = x.shape[-1]
    is_greedy = temperature <= 0
    scaled = x / torch.where(is_greedy, 1.0, temperature).unsqueeze(-1)

    order = torch.sort(scaled, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(vocab_size, device=x.device).expand_as(order))
    k = torch.where(top_k > 0, top_k, vocab_size).unsqueeze(-1)
    kept = torch.where(rank < k, scaled, -INF)
    renormalised = oracle_log_softmax(kept)

    inclusive = oracle_inclusive_prefix_sum(torch.exp(renormalised.gather(-1, order)))
    before = torch.cat([torch.zeros_like(inclusive[..., :1]), inclusive[..., :-1]], dim=-1)
    is_first = torch.arange(vocab_size, device=x.device) == 0
    keep_sorted = (before < top_p.unsqueeze(-1)) | is_first | (top_p >= 1).unsqueeze(-1)
    filtered = torch.where(keep_sorted.gather(-1, rank), renormalised, -INF)

    gumbel = -torch.log(-torch.log(oracle_uniform(oracle_noise_bits(seed, position, vocab_size), x.dtype)))
    drawn = oracle_first_argmax(filtered + gumbel)
    return torch.where(is_greedy, oracle_first_argmax(x), drawn)


def oracle_sample(logprobs, temperature, top_k, top_p, seed, position, dtype):
    """The oracle over the whole batch at once: the sampler tiles rows, which never changes a row's arithmetic."""
    return oracle_sample_rows(logprobs.to(dtype), temperature.to(dtype), top_k, top_p.to(dtype), seed, position)


def sample(batch, dtype):
    return reference.sample(*batch, input_dtype="float32", compute_dtype=str(dtype).removeprefix("torch."),
                            noise="splitmix64", method="gumbel_max")


NUM_ROW_KINDS = 10


def logprob_row(g: torch.Generator, kind: int, width: int) -> torch.Tensor:
    """One [width] float32 row of a kind sampling must survive: ordinary, tied, masked, NaN, ±inf, signed zeros."""
    randn = lambda scale: torch.randn(width, generator=g, dtype=torch.float64) * scale  # noqa: E731
    spot = lambda: torch.randint(0, width, (), generator=g).item()  # noqa: E731
    if kind == 0:
        row = torch.log_softmax(randn(6.0), -1)
    elif kind == 1:  # flat: every token ties
        row = torch.full((width,), -math.log(width), dtype=torch.float64)
    elif kind == 2:  # a few distinct values, many exact ties
        row = torch.log_softmax(torch.randint(-2, 3, (width,), generator=g).double(), -1)
    elif kind == 3:  # most of the vocabulary masked
        row = torch.log_softmax(randn(3.0), -1).masked_fill(torch.rand(width, generator=g) < 0.7, -INF)
    elif kind == 4:
        row = torch.full((width,), -INF, dtype=torch.float64)
    elif kind == 5:
        row = torch.log_softmax(randn(1.0), -1)
        row[spot()] = NAN
    elif kind == 6:  # not a log-probability row, but any input must give the oracle's token
        row = randn(2.0)
        row[spot()] = INF
    elif kind == 7:  # the maximum is zero, held by both signs
        row = randn(3.0) - 40
        row[spot()], row[spot()] = 0.0, -0.0
    elif kind == 8:  # a wide range: most exp underflow
        row = torch.log_softmax(randn(40.0), -1)
    else:  # one token holds (almost) all the mass: its log-prob is -0.0 and the renormaliser's log(Σ) is 0
        row = randn(1.0) - 60
        row[spot()] = -0.0
    return row.float()


def settings(g: torch.Generator, rows: int, width: int, case: str) -> list[torch.Tensor]:
    """[temperature, top_k, top_p, seed, position] for `rows` rows of one case."""
    sampled_temperatures = [0.05, 0.6, 1.0, 1.7]
    off_k, off_p = [0, -3, width, width + 9], [1.0, 1.25, INF]
    on_k, on_p = [1, 2, 3, 17, max(1, width - 1)], [0.0, 0.3, 0.9, 0.999, -1.0, NAN]
    temperatures, top_ks, top_ps = {
        "no_filter": (sampled_temperatures, off_k, off_p),
        "top_k": (sampled_temperatures, on_k, off_p),
        "top_p": (sampled_temperatures, off_k, on_p),
        "both": (sampled_temperatures, on_k, on_p),
        "greedy": ([0.0, -0.0, -1.0], off_k + on_k, off_p + on_p),
        "mixed": (sampled_temperatures + [0.0, NAN], off_k + on_k, off_p + on_p),
    }[case]
    pick = lambda values: [values[i] for i in torch.randint(0, len(values), (rows,), generator=g).tolist()]  # noqa: E731
    return [
        torch.tensor(pick(temperatures), dtype=torch.float32),
        torch.tensor(pick(top_ks), dtype=torch.int64),
        torch.tensor(pick(top_ps), dtype=torch.float32),
        torch.randint(-(2**63), 2**63 - 1, (rows,), generator=g),
        torch.randint(0, 1 << 20, (rows,), generator=g),
    ]


CASES = ("no_filter", "top_k", "top_p", "both", "greedy", "mixed")
WIDTHS = (7, 300, 512, 1025)  # below one vocab block, a multiple of it, and neither
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
NUM_ROWS = 33


def batches(case: str, device: str = "cpu"):
    """(batch, dtype) for every width and compute dtype: NUM_ROWS rows, every row kind several times."""
    for i, width in enumerate(WIDTHS):
        for j, dtype in enumerate(DTYPES):
            g = torch.Generator().manual_seed(1000 * CASES.index(case) + 10 * i + j)
            kinds = torch.randperm(NUM_ROWS, generator=g) % NUM_ROW_KINDS
            logprobs = torch.stack([logprob_row(g, kind, width) for kind in kinds.tolist()])
            yield [t.to(device) for t in (logprobs, *settings(g, NUM_ROWS, width, case))], dtype


_ORACLE = {}


def oracle_tokens(case: str, device: str) -> list[torch.Tensor]:
    if (case, device) not in _ORACLE:
        _ORACLE[case, device] = [oracle_sample(*batch, dtype) for batch, dtype in batches(case, device)]
    return _ORACLE[case, device]


def num_mismatches(case: str, device: str = "cpu", *, alone: bool = False) -> int:
    """Rows whose token differs from the oracle's, over every batch of `case` (each row alone with `alone`)."""
    count = 0
    for (batch, dtype), expected in zip(batches(case, device), oracle_tokens(case, device)):
        if alone:
            got = torch.cat([sample([t[r : r + 1] for t in batch], dtype) for r in range(NUM_ROWS)])
        else:
            got = sample(batch, dtype)
        count += int((got != expected).sum())
    return count


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_tokens_match_the_oracle(case, device):
    assert num_mismatches(case, device) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["no_filter", "both", "mixed"])
def test_tokens_match_the_oracle_one_row_at_a_time(case, device):
    assert num_mismatches(case, device, alone=True) == 0


def test_the_oracle_matches_the_published_splitmix64():
    assert oracle_splitmix64(torch.tensor([0])).item() & ((1 << 64) - 1) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_noise_matches_the_oracle(dtype):
    g = torch.Generator().manual_seed(5)
    seed = torch.randint(-(2**63), 2**63 - 1, (9,), generator=g)
    position = torch.randint(0, 1 << 30, (9,), generator=g)
    bits = oracle_noise_bits(seed, position, 1000)
    assert torch.equal(reference.noise_bits(seed, position, 1000), bits)
    extremes = torch.tensor([0, -1, 1, 1 << 62, -(1 << 63), (1 << 63) - 1])
    for b in (bits, extremes):
        assert torch.equal(reference.uniform(b, dtype).view(INT64[dtype]), oracle_uniform(b, dtype).view(INT64[dtype]))
    u = reference._uniform_noise(seed, position, 1000, dtype)
    assert torch.equal(u.view(INT64[dtype]), oracle_uniform(bits, dtype).view(INT64[dtype]))
    # mix64's last xorshift may be skipped only where u reads no more than the top 31 bits.
    unmixed = _no_final_xorshift(seed, position, 1000, dtype)
    assert torch.equal(unmixed, u) == (dtype != torch.float64)


def test_prefix_sums_match_the_unpadded_doubling():
    g = torch.Generator().manual_seed(6)
    for width in (1, 2, 3, 5, 64, 300, 1025):
        x = torch.rand(4, width, generator=g) ** 8
        x[1, ::3] = 0.0
        x[2, width // 2] = INF
        x[3, -1] = -0.0
        sums = reference._prefix_sums(x)
        assert torch.equal(sums[..., -width:].view(torch.int32), oracle_inclusive_prefix_sum(x).view(torch.int32))
        assert torch.equal(sums[..., -width - 1].view(torch.int32), torch.full((4,), -0.0).view(torch.int32))


def test_first_argmax_matches_the_tree_max():
    rows = torch.tensor([
        [-2.0, -1.0, -1.0, -3.0, -1.0],
        [0.0, -0.0, 0.0, -1.0, -0.0],
        [-0.0, 0.0, -5.0, 0.0, -0.0],
        [-INF, -INF, -INF, -INF, -INF],
        [-1.0, NAN, 3.0, NAN, INF],
        [NAN, NAN, NAN, NAN, NAN],
        [-INF, INF, INF, 0.0, -INF],
    ])
    g = torch.Generator().manual_seed(7)
    wide = torch.randint(-3, 3, (8, 1025), generator=g).float()
    wide[2, 700], wide[3, 300], wide[4] = NAN, INF, -INF
    for x in (rows, wide, wide.bfloat16()):
        assert torch.equal(reference.first_argmax(x), oracle_first_argmax(x))


def test_a_row_that_keeps_every_token_gets_the_same_bits_from_the_filtering_path():
    for batch, dtype in batches("no_filter"):
        scaled = batch[0].to(dtype) / batch[1].to(dtype).unsqueeze(-1)
        full = reference._filter(scaled, batch[2], batch[3].to(dtype), any_top_k=True, any_top_p=True)
        assert torch.equal(full.view(INT64[dtype]), reference._renormalise(scaled).view(INT64[dtype]))


def _skip_log_softmax(x):
    return x


def _last_of_ties(x):
    return x.shape[-1] - 1 - torch.argmax(x.flip(-1), dim=-1)


def _no_final_xorshift(seed, position, vocab_size, dtype):
    return reference.uniform(reference._mix64_multiplies(reference._counters(seed, position, vocab_size)), dtype)


_FILTER = reference._filter


def _no_top_p(scaled, top_k, top_p, *, any_top_k, any_top_p):
    return _FILTER(scaled, top_k, top_p, any_top_k=any_top_k, any_top_p=False)


def _rows_swapped(scaled, top_k, top_p, *, any_top_k, any_top_p):
    return _FILTER(scaled, top_k, top_p, any_top_k=any_top_k, any_top_p=any_top_p).roll(1, 0)


MUTANTS = [
    ("_renormalise", _skip_log_softmax, "no_filter"),
    ("first_argmax", _last_of_ties, "greedy"),
    ("_filter", _no_top_p, "top_p"),
    ("_filter", _rows_swapped, "mixed"),
]


@pytest.mark.parametrize("name, mutant, case", MUTANTS, ids=[m[1].__name__ for m in MUTANTS])
def test_the_comparison_catches_a_broken_sampler(monkeypatch, name, mutant, case):
    oracle_tokens(case, "cpu")  # computed before the patch (the oracle shares nothing with it anyway)
    monkeypatch.setattr(reference, name, mutant)
    assert num_mismatches(case) > 0
