"""sampling.triton: its noise is the reference's bit for bit; greedy rows are torch.argmax; sampled rows
are the Gumbel-max of x / t with that noise, so their tokens follow softmax(x / t); filtering rows are
the reference's; every row's token is the same alone and in any batch, next to deliberately
batch-dependent variants; the admission battery admits it.

On a machine with a GPU the kernel is compiled for it. Without one it runs in Triton's interpreter
(numpy on the CPU, about 10 ms per sampled row), so draw counts are small and the battery probe is a
reduced version of the family's own; TRITON_INTERPRET is set before anything imports triton, as in
`tests/ops/linear/test_triton.py`.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import DEVICE, ON_GPU, batch_dependent, bitwise_equal, require_triton

require_triton()

from isoexec.ops import triton_support  # noqa: E402
from isoexec.ops.common import torch_dtype  # noqa: E402
from isoexec.ops.sampling import probe as sampling_probe  # noqa: E402
from isoexec.ops.sampling import reference  # noqa: E402
from isoexec.ops.sampling import triton as sampling_triton  # noqa: E402
from isoexec.ops.sampling.triton import _log_neg_log_uniform  # noqa: E402
from isoexec.ops.triton_support import jit, tl  # noqa: E402
from isoexec.runtime.registry import REGISTRY  # noqa: E402
from isoexec.validate.battery import rowwise, validate_entry  # noqa: E402
from ops.triton_impls import assert_admitted, contract_with  # noqa: E402

pytestmark = pytest.mark.gpu

INF, NAN = float("inf"), float("nan")
CONSTANTS = {"input_dtype": "float32", "compute_dtype": "float32", "noise": "splitmix64", "method": "gumbel_max"}


def sample(logprobs, *rest, **constants):
    return sampling_triton.sample(logprobs, *rest, **(CONSTANTS | constants))


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def requests(rows: int, temperature=1.0, top_k=0, top_p=1.0, seed=None, position=None) -> list[torch.Tensor]:
    """[temperature, top_k, top_p, seed, position] for `rows` rows on DEVICE; scalars are broadcast."""
    def column(value, dtype):
        return (value.to(dtype) if isinstance(value, torch.Tensor) else torch.full((rows,), value, dtype=dtype)).to(DEVICE)

    seed = torch.arange(rows) if seed is None else seed
    position = torch.full((rows,), 11) if position is None else position
    return [column(temperature, torch.float32), column(top_k, torch.int64), column(top_p, torch.float32),
            column(seed, torch.int64), column(position, torch.int64)]


def log_softmax_rows(rows: int, width: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.log_softmax(torch.randn(rows, width, generator=generator(seed), dtype=torch.float64) * scale, -1).float()


def draw_many(row: torch.Tensor, num_seeds: int, **settings) -> torch.Tensor:
    """Tokens drawn for one log-probability row under `num_seeds` different seeds, on the CPU."""
    logprobs = row.float().expand(num_seeds, -1).contiguous().to(DEVICE)
    return sample(logprobs, *requests(num_seeds, **settings)).cpu()


# noise


def test_noise_bits_equal_the_reference_bit_for_bit():
    """64-bit products and shifts wrap modulo 2^64 on the GPU and in the interpreter's numpy uint64 alike;
    the extreme seeds and positions, and a vocabulary of two chunks, would show where they did not."""
    extremes = torch.tensor([0, -1, 2**63 - 1, -(2**63), -12345])
    seed = torch.cat([extremes, torch.randint(-(2**63), 2**63 - 1, (3,), generator=generator(0))])
    position = torch.cat([extremes.flip(0), torch.randint(0, 1 << 20, (3,), generator=generator(1))])
    vocab_size = sampling_triton.VOCAB_BLOCK + 37
    bits = sampling_triton.noise_bits(seed.to(DEVICE), position.to(DEVICE), vocab_size)
    assert torch.equal(bits.cpu(), reference.noise_bits(seed, position, vocab_size))
    assert torch.equal(sampling_triton.noise_bits(seed[::2].to(DEVICE), position[::2].to(DEVICE), 5).cpu(),
                       reference.noise_bits(seed[::2], position[::2], 5))


@jit
def _log_neg_log_uniform_kernel(bits, out, N: tl.constexpr, BLOCK: tl.constexpr):
    o_n = tl.arange(0, BLOCK)
    m_n = o_n < N
    b_bits = tl.load(bits + o_n, mask=m_n, other=0).to(tl.uint64, bitcast=True)
    tl.store(out + o_n, _log_neg_log_uniform(b_bits), mask=m_n)


def test_gumbel_noise_is_finite_and_accurate_at_the_extreme_bits():
    """u = 1 - 2^-24 needs log accurate near 1 (a fast log with an absolute error bound turns it into
    0 or a NaN); on a GPU this checks how Triton lowers tl.log."""
    extremes = torch.tensor([0, -1, 1 << 62, -(1 << 63), (1 << 63) - 1, (1 << 40) - 1, -(1 << 40), 0x5E2D58D8B3BCDF1A])
    bits = torch.cat([extremes, torch.randint(-(2**63), 2**63 - 1, (500,), generator=generator(2))])
    out = torch.empty(bits.shape, device=DEVICE)
    _log_neg_log_uniform_kernel[(1,)](bits.to(DEVICE), out, N=bits.numel(), BLOCK=1024)
    exact = torch.log(-torch.log(reference.uniform(bits, torch.float32).double()))
    assert torch.isfinite(out).all()
    assert (out.cpu().double() - exact).abs().max() < 1e-5


# greedy rows


def greedy_rows(width: int = 40) -> torch.Tensor:
    """Rows whose argmax needs care, with maxima and NaNs in different chunks of 16: [8, width]."""
    x = log_softmax_rows(8, width, seed=3)
    x[0] = -1.5
    x[1, [3, 17, 33]] = 1.0
    x[2, [30, 20]] = NAN
    x[3] = -INF
    x[4, 5], x[4, 25] = INF, NAN
    x[5] = torch.where(torch.arange(width) % 2 == 0, torch.tensor(-0.0), torch.tensor(0.0))
    x[5, :8] = -1.0
    x[6, width - 1] = 2.0
    x[7, 17:] = -INF
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_are_torch_argmax(dtype):
    """The lowest index attaining the maximum, a NaN counting as the maximum, -0.0 equal to +0.0."""
    x = greedy_rows().to(dtype)
    expected = torch.argmax(x.float(), dim=-1)
    assert expected[:7].tolist() == [0, 3, 20, 0, 25, 8, 39]
    settings = requests(8, temperature=0.0, top_k=torch.tensor([0, 1, 5, 0, 0, 2, 0, 0]), top_p=0.5)
    for vocab_block in (16, 64, sampling_triton.VOCAB_BLOCK):
        tokens = sampling_triton.sample_rows(x.to(DEVICE), *settings, vocab_block=vocab_block)
        assert torch.equal(tokens.cpu(), expected), vocab_block
    assert torch.equal(sample(x.to(DEVICE), *settings, input_dtype=str(dtype).removeprefix("torch.")).cpu(), expected)


def test_degenerate_sampled_rows_stay_row_local():
    x = log_softmax_rows(6, 50, seed=4)
    settings = requests(6, temperature=torch.tensor([1.0, 1.0, 0.7, 1.0, 0.0, 1.3]), seed=torch.arange(6) * 7919)
    clean = sample(x.to(DEVICE), *settings).cpu()
    x[1] = -INF
    x[3, 40], x[3, 12] = NAN, NAN
    x[4, 9] = NAN
    out = sample(x.to(DEVICE), *settings).cpu()
    assert out[1].item() == 0 and out[3].item() == 12 and out[4].item() == 9
    assert torch.equal(out[[0, 2, 5]], clean[[0, 2, 5]])


# sampled rows


def gumbel_max_float64(x: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, position: torch.Tensor):
    """The kernel's draw in float64 from the reference's noise: tokens [R] and each row's margin between
    its best and second-best scores."""
    u = reference.uniform(reference.noise_bits(seed, position, x.shape[-1]), torch.float32).double()
    z = x.double() / temperature.double().unsqueeze(-1) - torch.log(-torch.log(u))  # [R, V]
    top = torch.topk(z, 2, dim=-1)
    return top.indices[:, 0], top.values[:, 0] - top.values[:, 1]


@pytest.mark.parametrize("temperature", [0.7] + ([1.0, 2.0] if ON_GPU else []))
def test_sampled_rows_are_the_gumbel_max_and_follow_the_tempered_softmax(temperature):
    """Every draw is the float64 Gumbel-max token (up to fp32 rounding at near-ties), and the drawn
    tokens' frequencies pass a chi-square test against softmax(x / t)."""
    row = torch.log_softmax(torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0, 2.0, -0.3, 0.0], dtype=torch.float64), -1).float()
    num_seeds = 20000 if ON_GPU else 600
    seed, position = torch.arange(num_seeds) * 1_000_003 - 12345, torch.arange(num_seeds) % 97
    tokens = draw_many(row, num_seeds, temperature=temperature, seed=seed, position=position)
    expected, margin = gumbel_max_float64(row.expand(num_seeds, -1), torch.full((num_seeds,), temperature), seed, position)
    differ = tokens != expected
    assert bool((margin[differ] < 1e-4).all()) and int(differ.sum()) <= num_seeds // 1000, int(differ.sum())
    counts = torch.bincount(tokens, minlength=8).double()
    probs = torch.softmax(row.double() / temperature, -1)
    chi_square = float(((counts - num_seeds * probs) ** 2 / (num_seeds * probs)).sum())
    # The chi-square quantile for 7 degrees of freedom at p = 0.001.
    assert chi_square < 24.3, (chi_square, counts / num_seeds, probs)


def test_tokens_agree_with_the_reference_where_rounding_leaves_the_winner():
    """Same noise, same formula up to the renormalising constant: the tokens are the reference's but
    for fp32 near-ties."""
    x = log_softmax_rows(48, 300, seed=5)
    settings = requests(48, temperature=torch.linspace(0.2, 2.0, 48), seed=torch.arange(48) * 31 - 7, position=torch.arange(48))
    ours = sample(x.to(DEVICE), *settings).cpu()
    theirs = reference.sample(x, *[s.cpu() for s in settings], **CONSTANTS)
    assert int((ours != theirs).sum()) <= 1


# filtering rows


def test_filtering_rows_draw_the_reference_token_inside_their_top_k_and_top_p_sets():
    g = generator(6)
    row = torch.log_softmax(torch.randn(30, generator=g, dtype=torch.float64) * 2, -1).float()
    num_seeds = 300
    seed = torch.randint(-(2**63), 2**63 - 1, (num_seeds,), generator=g)
    top_k = torch.tensor([4, 0, 4, 0, 0, 1])[torch.arange(num_seeds) % 6]
    top_p = torch.tensor([1.0, 0.6, 0.6, 1.0, 1.0, 0.3])[torch.arange(num_seeds) % 6]
    settings = dict(temperature=1.5, top_k=top_k, top_p=top_p, seed=seed)
    tokens = draw_many(row, num_seeds, **settings)
    assert bool((tokens >= 0).all())
    top_4 = set(torch.topk(row, 4).indices.tolist())
    ranked = torch.softmax(row.double() / 1.5, -1).sort(descending=True)
    nucleus = set(ranked.indices[: int((ranked.values.cumsum(0) - ranked.values < 0.6).sum())].tolist())
    assert set(tokens[top_k == 4].tolist()) <= top_4
    assert set(tokens[(top_p == 0.6) & (top_k == 0)].tolist()) <= nucleus
    assert set(tokens[top_k == 1].tolist()) == {int(row.argmax())}
    filtering = (top_k == 4) | (top_p < 1)
    cpu_settings = [r.cpu() for r in requests(num_seeds, **settings)]
    expected = reference.sample(row.expand(num_seeds, -1).contiguous(), *cpu_settings, **CONSTANTS)
    assert torch.equal(tokens[filtering], expected[filtering])
    assert len(set(tokens[~filtering].tolist())) > 5


# batch invariance


def knife_edge(x: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, rows, candidates=6):
    """Make `rows` of x [R, V] near-ties: their first `candidates` tokens reach x / t + g = -1 within a few
    ulps given their own noise g, every other token -40, so the last bit of any step can decide the
    token. A change in rounding that a row shows only inside a batch flips such a row; on ordinary rows
    it seldom shows at all."""
    rows = torch.as_tensor(rows)
    g = reference.gumbel_noise(seed[rows], position[rows], x.shape[-1], torch.float32)  # [r, V]
    t = temperature[rows].unsqueeze(-1)
    x[rows] = -40.0
    x[rows, :candidates] = (t * (-1.0 - g[:, :candidates])).float()


def mixed_batch(rows: int = 40, width: int = 300) -> list[torch.Tensor]:
    """Greedy, filtering and plain rows, a masked row, NaN rows, duplicated requests and near-ties, on DEVICE."""
    g = generator(7)
    x = log_softmax_rows(rows, width, seed=8)
    x[0] = 0.0
    x[3, width // 3 :] = -INF
    x[5] = -INF
    x[6, 100], x[7, 50] = NAN, NAN
    r = torch.arange(rows)
    temperature = torch.tensor([0.0, 0.6, 1.0, 1.7, 1.0])[r % 5]
    seed = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=g)
    position = torch.randint(0, 1 << 20, (rows,), generator=g)
    seed[10:14], position[10:14] = seed[9], position[9]
    knife_edge(x, temperature, seed, position, [i for i in range(15, rows) if i % 5 in (1, 2, 4)])
    settings = requests(
        rows,
        temperature=temperature,
        top_k=torch.tensor([0, 0, 3, 40, 0, 0, 100_000])[r % 7],
        top_p=torch.tensor([1.0, 1.0, 0.9, 1.0, 0.3])[r % 5],
        seed=seed,
        position=position,
    )
    return [x.to(DEVICE), *settings]


def test_the_engines_hint_agrees_with_the_kernels_flags():
    """The engine tells the sampler that no row filters (`may_filter=False`, from `SamplingParams.filters`), so the
    call never waits on the device; a wrong hint would leave a filtering row drawn unfiltered. The rule and the
    kernel's flags agree at every edge: greedy, top_k 0 / 1 / V - 1 / V / V + 1, top_p 1 and just below; and with
    the hint a batch that does not filter draws the tokens it draws without it."""
    from isoexec.engine import SamplingParams

    vocab = 64
    grid = [SamplingParams(temperature=t, top_k=k, top_p=p) for t in (0.0, 0.5) for k in (0, 1, vocab - 1, vocab, vocab + 1)
            for p in (1.0, 0.999, 0.5)]
    x = torch.randn(len(grid), vocab, generator=generator(3)).log_softmax(-1).to(DEVICE)
    rest = requests(len(grid), temperature=torch.tensor([p.temperature for p in grid]), top_k=torch.tensor([p.top_k for p in grid]),
                    top_p=torch.tensor([p.top_p for p in grid]))
    _, flags = sampling_triton.draw_unfiltered(x, *rest)
    assert [bool(f) for f in flags.tolist()] == [p.filters(vocab) for p in grid]
    assert 0 < sum(p.filters(vocab) for p in grid) < len(grid)
    plain = [r for r, p in enumerate(grid) if not p.filters(vocab)]
    subset = [t[plain] for t in rest]
    assert torch.equal(sample(x[plain], *subset, may_filter=False), sample(x[plain], *subset))


def test_tokens_are_bitwise_invariant_to_the_batch():
    batched = mixed_batch()
    assert batch_dependent(sample, batched) == []
    rows = batched[0].shape[0]
    alone = torch.cat([sample(*[b[i : i + 1] for b in batched]) for i in range(rows)])
    order = torch.randperm(rows, generator=generator(9)).to(DEVICE)
    assert bitwise_equal(sample(*[b[order] for b in batched]), alone[order])
    repeated = torch.arange(rows, device=DEVICE).repeat_interleave(2)
    assert bitwise_equal(sample(*[b[repeated] for b in batched]), alone[repeated])
    strided = [torch.stack([b, b], dim=-1)[..., 0] for b in batched]
    assert not strided[0].is_contiguous() and bitwise_equal(sample(*strided), alone)
    assert sample(*[b[:0] for b in batched]).shape == (0,)


def test_vocab_block_and_warps_never_change_a_token():
    """Why the block is pinned in the module, not the contract: even one chosen from the batch size
    leaves every row's token as it was."""
    batched = mixed_batch(rows=20, width=150)
    expected = sampling_triton.sample_rows(*batched)
    for vocab_block, num_warps in [(16, 1), (32, 4), (64, 8)]:
        assert torch.equal(sampling_triton.sample_rows(*batched, vocab_block=vocab_block, num_warps=num_warps), expected)

    def block_from_rows(x, *rest):
        return sampling_triton.sample_rows(x, *rest, vocab_block=16 if x.shape[0] < 8 else 64)

    assert batch_dependent(block_from_rows, batched, sizes=(3, 16)) == []


def test_segments_never_change_a_token():
    """A row's chunks split among 1 … 10 programs: the same tokens (every fold is a max or a first-index
    argmax). Row 0 is greedy with every logit 0.0, so each segment offers a tie at its first index: a pick
    that preferred a later segment's candidate would draw another token than 0, by construction."""
    batched = mixed_batch(rows=20, width=150)
    expected, flags = sampling_triton.draw_unfiltered(*batched, vocab_block=16, num_segments=1)
    assert int(expected[0]) == 0 and float(batched[1][0]) == 0.0
    for count in (2, 3, 4, 10):  # 150 tokens in chunks of 16: 10 chunks
        tokens, same_flags = sampling_triton.draw_unfiltered(*batched, vocab_block=16, num_segments=count)
        assert torch.equal(tokens, expected) and torch.equal(same_flags, flags), count
    assert sampling_triton.segments(1, 38) == 38 and sampling_triton.segments(64, 38) == 8 and sampling_triton.segments(4096, 38) == 1



@pytest.mark.skipif(not ON_GPU, reason="151,936-token rows in 4,096-wide chunks: minutes per row in the interpreter")
def test_segments_never_change_a_token_at_qwen3_vocabulary():
    """The same at the engine's size: 64 rows of Qwen3's vocabulary in the default 4,096-token chunks over 8
    warps (38 chunks), split 1, 2, 8 (the default at 64 rows) and 38 ways, sampled at t = 1 and 0.7 and greedy.
    The control: the rows drawn at another position (other noise) give other tokens under the same check."""
    rows = 64
    x = torch.randn(rows, 151_936, generator=torch.Generator().manual_seed(0)).log_softmax(-1).bfloat16().to(DEVICE)
    top_k, top_p = torch.zeros(rows, dtype=torch.int64, device=DEVICE), torch.ones(rows, device=DEVICE)
    seed, position = torch.arange(rows, device=DEVICE), torch.arange(rows, device=DEVICE) + 7
    for t in (1.0, 0.7, 0.0):
        temperature = torch.full((rows,), t, device=DEVICE)
        expected, _ = sampling_triton.draw_unfiltered(x, temperature, top_k, top_p, seed, position, num_segments=1)
        for count in (None, 2, 8, 38):
            tokens, _ = sampling_triton.draw_unfiltered(x, temperature, top_k, top_p, seed, position, num_segments=count)
            assert torch.equal(tokens, expected), (t, count)
    ones = torch.ones(rows, device=DEVICE)
    drawn, _ = sampling_triton.draw_unfiltered(x, ones, top_k, top_p, seed, position, num_segments=1)
    moved, _ = sampling_triton.draw_unfiltered(x, ones, top_k, top_p, seed, position + 1)
    assert int((moved != drawn).sum()) > rows // 2


@pytest.mark.skipif(not ON_GPU, reason="counts compiled kernels")
def test_any_number_of_rows_takes_one_compiled_kernel():
    """The split is a runtime argument: rows 1 … 64 (38, 36, 19, 10, 8 segments) run one compiled kernel each
    of the three, so a prefill that samples a new number of rows never compiles in the middle of a run."""
    x = torch.randn(64, 151_936, generator=torch.Generator().manual_seed(1)).log_softmax(-1).bfloat16().to(DEVICE)
    kernels = (sampling_triton.segment_max_kernel, sampling_triton.sample_kernel, sampling_triton.pick_kernel)

    def compiled():
        return [{id(k) for k in kernel.launches.values()} for kernel in kernels]

    def draw(rows):
        ones, zeros = torch.ones(rows, device=DEVICE), torch.zeros(rows, dtype=torch.int64, device=DEVICE)
        sampling_triton.draw_unfiltered(x[:rows], ones, zeros, ones, zeros, zeros)

    draw(1)
    first = compiled()
    for rows in (5, 13, 14, 27, 50, 64):
        draw(rows)
    assert len({sampling_triton.segments(rows, 38) for rows in (1, 5, 13, 14, 27, 50, 64)}) >= 5
    assert compiled() == first

def _slot_as_position(x, temperature, top_k, top_p, seed, position):
    """The noise counter taken from the row's slot in the batch instead of its position."""
    return sample(x, temperature, top_k, top_p, seed, torch.arange(x.shape[0], device=x.device))


def _bfloat16_once_batched(x, *rest):
    """A lower-precision path once the batch has 8 rows, as kernels chosen by batch size do."""
    return sample(x.bfloat16().float() if x.shape[0] >= 8 else x, *rest)


def _one_ulp_once_batched(x, *rest):
    """Log-probabilities one ulp off once the batch has 8 rows: what a reduction reordered by the batch
    size leaves behind."""
    return sample(torch.nextafter(x, torch.zeros_like(x)) if x.shape[0] >= 8 else x, *rest)


@pytest.mark.parametrize("mutant", [_slot_as_position, _bfloat16_once_batched, _one_ulp_once_batched])
def test_batch_dependent_variants_are_caught(mutant):
    assert batch_dependent(mutant, mixed_batch(rows=34)), "the invariance check missed a batch-dependent sampler"


# registration, refusal, admission


def test_registered_with_its_constants_checked():
    impl = REGISTRY.get("sampling.triton", 1)
    assert impl.region == "sampling" and impl.cases == {"engine_prefill", "engine_decode"} and impl.source_sha256
    impl.check(CONSTANTS | {"input_dtype": "bfloat16"})
    for change, message in [({"compute_dtype": "bfloat16"}, "float32 only"), ({"noise": "philox"}, "not implemented"),
                            ({"method": "inverse_cdf"}, "not implemented"), ({"input_dtype": "float64"}, "input_dtype must be"),
                            ({"vocab_block": 64}, "unsupported constants")]:
        with pytest.raises(ValueError, match=message):
            impl.check(CONSTANTS | change)


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(triton_support, "interpreting", lambda: False)
    with pytest.raises(RuntimeError, match="sampling.triton needs a CUDA device or TRITON_INTERPRET=1"):
        sampling_triton.sample(torch.zeros(2, 8), *[r.cpu() for r in requests(2)], **CONSTANTS)


def _run_python(script: str, **env) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300, env=env)


def test_without_triton_the_family_imports_and_registers_only_the_others():
    result = _run_python("""
        import sys; sys.modules['triton'] = None
        import isoexec.ops.sampling
        from isoexec.runtime.registry import REGISTRY
        assert REGISTRY.get('sampling.triton', 1) is None and REGISTRY.get('sampling.reference', 1) is not None
    """)
    assert result.returncode == 0, result.stderr


PTXAS = pathlib.Path(triton_support.triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(ON_GPU or not PTXAS.exists(), reason="compiled on a GPU by every other test; needs Triton's ptxas otherwise")
def test_the_kernels_compile_for_hopper(tmp_path):
    """The interpreter runs Python the compiler refuses (a kernel reading a plain global, say): compile
    the kernels for sm_90, and check that tl.log is libdevice's precise log, not lg2.approx (which
    `test_gumbel_noise_is_finite_and_accurate_at_the_extreme_bits` would catch on a GPU)."""
    result = _run_python("""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from isoexec.ops.sampling import triton as sampling_triton
        target = GPUTarget("cuda", 90, 32)
        sizes = {"V": 151936, "VOCAB_BLOCK": 4096}
        def build(kernel, pointers, constexprs, num_warps=8):
            types = {n: "constexpr" if n in constexprs else pointers.get(n, "i32" if n in ("NS", "PER_SEGMENT") else "i64") for n in kernel.arg_names}
            return triton.compile(ASTSource(kernel, types, constexprs=constexprs), target=target, options={"num_warps": num_warps}).asm["ptx"]
        build(sampling_triton.segment_max_kernel, {"x": "*bf16", "seg_max": "*fp32"}, sizes)
        pointers = {"x": "*bf16", "temperature": "*fp32", "top_k": "*i64", "top_p": "*fp32", "seed": "*i64", "position": "*i64",
                    "flags": "*i8", "seg_max": "*fp32", "seg_best": "*fp32", "seg_index": "*i32", "seg_nan": "*i32"}
        ptx = build(sampling_triton.sample_kernel, pointers, {**sizes, "NS_PAD": 64})
        assert "lg2.approx" not in ptx and "div.rn.f32" in ptx
        build(sampling_triton.pick_kernel, {**pointers, "tokens": "*i64"}, {"V": 151936, "NS_PAD": 64}, num_warps=1)
        names = ["seed", "position", "bits", "stride_s", "stride_q", "V", "NV", "VOCAB_BLOCK"]
        types = ["*i64"] * 3 + ["i64"] * 2 + ["constexpr"] * 3
        constexprs = {"V": 300, "NV": 1, "VOCAB_BLOCK": 512}
        source = ASTSource(sampling_triton.noise_bits_kernel, dict(zip(names, types)), constexprs=constexprs)
        triton.compile(source, target=target)
    """, TRITON_CACHE_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]


def _small_sampling_probe(ctx):
    """sampling's probe at one width with 24 rows and fewer batch sizes, for the interpreter."""
    dtype = torch_dtype(ctx.constants["input_dtype"])
    rows = 24
    logprobs = sampling_probe._logprobs(ctx, rows, 257).to(dtype).to(ctx.device)
    batched = [logprobs, *(t.to(ctx.device) for t in sampling_probe._requests(ctx, rows))]
    yield from rowwise(ctx, batched, sizes=(1, 3, 7, 16), label="V = 257")
    yield from sampling_probe.shuffled(ctx, batched)


def test_the_battery_admits_the_triton_sampler():
    contract = contract_with("sampling", "sampling.triton")  # the preset's constants
    probe = sampling_probe.probe if ON_GPU else _small_sampling_probe
    result = validate_entry(contract, contract.entry("sampling", "engine_decode"), probe, registry=REGISTRY, device=DEVICE)
    assert result.impl == "sampling.triton@1"
    assert_admitted(result, min_trials=60)
