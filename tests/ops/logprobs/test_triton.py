"""logprobs.triton: correctness against float64 (masked and poisoned rows included), gradients, bitwise
invariance to batch size, row position and strides next to a deliberately batch-dependent variant, and
admission through the battery.

Without a GPU the kernel runs in Triton's interpreter (see tests/ops/linear/test_triton.py for why
TRITON_INTERPRET is set before anything imports triton), so shapes are small and the battery probe is
a reduced version of the family's own. What the linear, rms_norm and logprobs Triton tests share is in
tests/ops/kernels_triton.py.
"""

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, batch_dependent, bitwise_equal, boundary, hazards, randn, require_triton

require_triton()

from ops.kernels_triton import LOGPROBS, assert_the_battery_admits, logprobs, strided  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

INF = float("inf")


# logprobs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 64, 300])
def test_logprobs_match_float64(dtype, width):
    x = randn(2, 3, width, seed=21, scale=4.0, dtype=dtype)
    y = logprobs(boundary(LOGPROBS, dtype) | {"output_dtype": "float32"})(x)
    assert y.shape == x.shape and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), torch.log_softmax(x.double(), -1), rtol=1e-5, atol=1e-5)


def test_logprobs_of_masked_and_poisoned_rows():
    x = randn(5, 100, seed=22, scale=4.0)
    x[0, ::3] = -INF
    x[1] = -INF
    x[2] = -INF
    x[2, 99] = 0.5
    x[3, 7] = float("nan")
    x[4, 3] = INF
    y = logprobs()(x)
    live = x[0] > -INF
    torch.testing.assert_close(y[0, live].double(), torch.log_softmax(x[0, live].double(), -1), rtol=1e-5, atol=1e-5)
    assert (y[0, ~live] == -INF).all() and (y[1] == -INF).all()
    assert (y[2, :99] == -INF).all() and y[2, 99] == 0.0
    assert y[3].isnan().all() and y[4].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_gradients_match_float64(dtype):
    """The backward kernel against float64 autograd: rows wider than one vocab block, a -inf logit (its
    log-prob is -inf, its gradient exactly the incoming one), a gradient given as an expanded (stride 0)
    tensor, and the logits' own dtype for the result."""
    x, g = randn(3, 70, seed=23, scale=2.0, dtype=dtype), randn(3, 70, seed=24)
    x[1, 5] = -INF
    param = x.clone().requires_grad_()
    logprobs(boundary(LOGPROBS, dtype) | {"output_dtype": "float32"})(param).backward(g)
    exact = x.double().requires_grad_()
    torch.log_softmax(exact, -1).backward(g.double())
    assert param.grad.dtype == dtype and param.grad[1, 5] == g[1, 5].to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 2**-7  # bf16: one rounding of the fp32 result

    def error(got, want):
        return ((got.double() - want).abs() / (want.abs() + 1)).max()

    assert error(param.grad, exact.grad) < tolerance
    ones = x.clone().requires_grad_()
    logprobs(boundary(LOGPROBS, dtype) | {"output_dtype": "float32"})(ones).sum().backward()  # gradient: ones, expanded
    assert error(ones.grad, 1 - 70 * torch.softmax(x.double(), -1)) < tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_rows_are_bitwise_invariant(dtype):
    x = torch.cat([randn(17, 100, seed=25, scale=4.0), hazards(100)]).to(dtype)
    op = logprobs(boundary(LOGPROBS, dtype) | {"output_dtype": "float32"})
    assert batch_dependent(op, [x]) == []
    assert bitwise_equal(op(strided(x)), op(x))


class _Replay(Exception):
    pass


def _tensor_parallel(form, x, shards):
    """Every rank's `form(x[:, shard], gather)`, as if the ranks ran side by side: each rank is re-run once per
    gather, returning the leaves every rank gave at the calls before and stopping at the next one."""
    given = []  # given[call][rank]: the leaves rank gave at that call
    for call in range(8):
        leaves = {}

        def run(rank):
            made = iter(range(call + 1))

            def gather(mine):
                n = next(made)
                if n == call:
                    leaves[rank] = mine.clone()
                    raise _Replay
                return torch.cat(given[n], dim=-1)

            return form(x[:, shards[rank]], gather)

        try:
            return [run(rank) for rank in range(len(shards))]
        except _Replay:
            for rank in range(len(shards)):  # every rank reaches the same call
                try:
                    run(rank)
                except _Replay:
                    pass
            given.append([leaves[rank] for rank in range(len(shards))])
    raise AssertionError("more gathers than a log-softmax needs")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_parallel_ranks_give_the_whole_rows_bits(dtype):
    """The impl's vocab_parallel form on ranks of whole 64-column chunks (widths 128, 0, 64 and the last 8) is the
    single-process op's output bit for bit, masked and poisoned rows included. The control: ranks that each
    log-softmax their own columns and fold the per-rank sums instead of the chunks' give other bits."""
    from isoexec.ops.logprobs import triton as logprobs_triton

    constants = boundary(LOGPROBS, dtype) | {"output_dtype": "float32"}
    x = torch.cat([randn(9, 200, seed=27, scale=4.0), hazards(200)]).to(dtype)
    x[0, ::3] = -INF
    x[1] = -INF
    shards = [slice(0, 128), slice(128, 128), slice(128, 192), slice(192, 200)]
    ranks = _tensor_parallel(lambda part, gather: logprobs_triton.vocab_parallel(part, gather, **constants), x, shards)
    whole = logprobs(constants)(x)
    assert [r.shape[-1] for r in ranks] == [128, 0, 64, 8]
    assert bitwise_equal(torch.cat(ranks, dim=-1), whole)

    def per_rank_sums(part, gather):
        shifted = part.float() - gather(part.float().amax(-1, keepdim=True) if part.shape[-1] else
                                        torch.full((part.shape[0], 1), -INF, device=part.device)).amax(-1, keepdim=True)
        return shifted - gather(torch.exp(shifted).sum(-1, keepdim=True)).sum(-1, keepdim=True).log()

    live = slice(2, 9)
    control = torch.cat(_tensor_parallel(per_rank_sums, x[live], shards), dim=-1)
    assert not bitwise_equal(control, whole[live])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_split_among_programs_give_one_programs_bits(dtype):
    """A call of few rows splits each row's chunks among programs (`segments`): at 2, 3 and 5 segments of a
    row of 5 chunks, masked and poisoned rows included, the output is that of one program a row bit for bit.
    The last row is built so that the order of the chunk sums' fold shows: chunk 0 holds one 0 (sum 1), each
    other chunk one logit whose exp e lies in (2^-25, 2^-24), the rest -inf. Folded in chunk order, 1 + e
    rounds back to 1 every time, and the 0 logit's log-prob is exactly 0; a split that summed each segment
    first (as a split log-sum-exp would) adds e + e = 2e, more than half an ulp of 1, and ends one ulp
    above, so that log-prob would be -2^-23: the control, by construction."""
    from isoexec.ops.logprobs import triton as logprobs_triton

    constants = boundary(LOGPROBS, dtype) | {"output_dtype": "float32"}
    built = torch.full((1, 320), -INF)
    built[0, 0] = 0.0
    built[0, 64::64] = -16.875  # exp: 4.7e-8
    x = torch.cat([randn(9, 320, seed=28, scale=4.0), hazards(320), built.to(DEVICE)]).to(dtype)  # chunks of 64: 5
    x[0, ::3] = -INF
    x[1] = -INF
    assert logprobs_triton.segments(len(x), 5) == 5 and logprobs_triton.segments(4096, 297) == 1
    whole = logprobs_triton.logprobs_fwd(x, torch.float32, vocab_block=64, num_warps=4, num_segments=1)  # one program a row
    assert bitwise_equal(logprobs(constants)(x), whole)  # the op's own split: 5 segments at these 15 rows
    for count in (2, 3, 5):
        split = logprobs_triton.logprobs_fwd(x, torch.float32, vocab_block=64, num_warps=4, num_segments=count)
        assert bitwise_equal(split, whole), count

    assert float(whole[-1, 0]) == 0.0
    e = torch.exp(x[-1, 64].float())
    one = torch.ones((), device=DEVICE)
    assert float((((one + e) + e) + e) + e) == 1.0 and float(((one + e) + e) + (e + e)) == 1.0 + 2**-23


def test_logprobs_with_its_vocab_block_chosen_from_the_batch_is_caught():
    def block_from_rows(x):
        return logprobs({**LOGPROBS, "vocab_block": 32 if x.shape[0] < 8 else 256})(x)

    x = randn(17, 150, seed=26, scale=4.0)
    assert batch_dependent(block_from_rows, [x]), "the invariance check missed a batch-dependent logprobs"


# admission


@pytest.mark.parametrize("region", ["logprobs"])
def test_the_battery_admits_the_triton_impl(region):
    assert_the_battery_admits(region)
