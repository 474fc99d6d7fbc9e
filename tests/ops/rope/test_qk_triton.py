"""The fused q/k norm, rotary and cache-write launch (`ops/rope/qk_triton.py`): the bits of rms_norm.triton,
rope.triton and the cache's index_copy called one after the other, at small shapes in the interpreter and at
Qwen3-0.6B's and Qwen3-8B's head shapes on a GPU; a control computing the same in float64, rounded once,
must differ. The binding offers the launch only where the contract pins those impls; a forward without
autograd launches it once a layer instead of the separate kernels, with the rows of a forward under autograd
(which runs the separate ops)."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import DEVICE, INTERPRETER_WARNINGS, ON_GPU, CountingKernel, bitwise_equal, int_view, randn, require_triton

require_triton()

from isoexec.contract import fit_contract, load_preset  # noqa: E402
from isoexec.ops import triton_support  # noqa: E402
from isoexec.model import PRESETS, init_random  # noqa: E402
from isoexec.ops.rms_norm import triton as rms_norm_triton  # noqa: E402
from isoexec.ops.rope import qk_triton, reference as rope_reference, triton as rope_triton  # noqa: E402
from isoexec.runtime.binding import QK_NORM_ROPE, bind  # noqa: E402
from isoexec.trainer import sequence_logprobs  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS]

THETA, MAX_POSITIONS, EPS = 1_000_000.0, 4096, 1e-6


def constants(dtype: str, reduce_block: int, num_warps: int = 1):
    norm = dict(input_dtype=dtype, output_dtype=dtype, accum_dtype="float32", reduce_block=reduce_block, num_warps=num_warps)
    rope = dict(input_dtype=dtype, output_dtype=dtype, table_dtype="float32", compute_dtype="float32", table_build="cpu_float64")
    return norm, rope


def projected(tokens, heads, kv_heads, head_dim, dtype, seed):
    """q, k, v as views of one joined projection's output [T, (H + 2 Hkv) D], as the layer gets them."""
    out = randn(tokens, (heads + 2 * kv_heads) * head_dim, seed=seed, dtype=dtype)
    q, k, v = out.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], 1)
    return q.unflatten(1, (heads, head_dim)), k.unflatten(1, (kv_heads, head_dim)), v.unflatten(1, (kv_heads, head_dim))


def separate(q, k, v, positions, weights, zero_centered, rotary_dim, cache, norm, rope):
    """The calls the launch stands for, one after the other."""
    centred = (True,) if zero_centered else ()
    rotary = () if rotary_dim is None else (rotary_dim,)
    if weights is not None:
        q = rms_norm_triton.rms_norm(q, weights[0], EPS, *centred, **norm)
        k = rms_norm_triton.rms_norm(k, weights[1], EPS, *centred, **norm)
    q = rope_triton.rope(q, positions, THETA, MAX_POSITIONS, *rotary, **rope)
    k = rope_triton.rope(k, positions, THETA, MAX_POSITIONS, *rotary, **rope)
    if cache is None:
        return q, k, v
    k_store, v_store, slots = cache
    k_store.index_copy_(0, slots, k)
    v_store.index_copy_(0, slots, v)
    return q, k_store, v_store


def in_float64(q, positions, weight, zero_centered, rotary_dim):
    """The control: the same norm and rotation in float64, rounded once at the end, another op order (no
    rounding of the norm's output, of each product or of each sum), which must differ somewhere."""
    x = q.double()
    w = weight.double() + 1.0 if zero_centered else weight.double()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
    rotary_dim = rotary_dim or q.shape[-1]
    table = rope_reference.cos_sin_table(THETA, rotary_dim, MAX_POSITIONS, "float32", str(q.device))[positions].double()
    cos, sin, half = table[:, None, :, 0], table[:, None, :, 1], rotary_dim // 2
    x1, x2 = normed[..., :half], normed[..., half:rotary_dim]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, normed[..., rotary_dim:]], -1).to(q.dtype)


SHAPES = [(5, 4, 2, 32, 16), (3, 2, 1, 16, 16)]  # tokens, heads, kv heads, head_dim, reduce_block
if ON_GPU:  # Qwen3-0.6B's and Qwen3-8B's heads, at batch 1 and a decode batch, with their fitted norm constants
    SHAPES += [(1, 16, 8, 128, 128), (64, 16, 8, 128, 128), (1, 32, 8, 128, 128), (37, 32, 8, 128, 128), (64, 32, 8, 128, 64)]
DTYPES = [torch.bfloat16, torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,kv_heads,head_dim,reduce_block", SHAPES)
@pytest.mark.parametrize("zero_centered,rotary_dim,with_cache", [(False, None, True), (True, None, False), (True, 8, True)])
def test_one_launch_gives_the_separate_calls_bits(dtype, tokens, heads, kv_heads, head_dim, reduce_block, zero_centered, rotary_dim, with_cache):
    name = str(dtype).removeprefix("torch.")
    norm, rope = constants(name, reduce_block)
    q, k, v = projected(tokens, heads, kv_heads, head_dim, dtype, seed=tokens + heads)
    weights = (randn(head_dim, seed=1, dtype=dtype), randn(head_dim, seed=2, dtype=dtype))
    positions = torch.randint(0, 3000, (tokens,), generator=torch.Generator().manual_seed(3)).to(DEVICE)

    def cache():
        if not with_cache:
            return None
        store = torch.full((2 * tokens + 3, kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
        slots = torch.randperm(2 * tokens + 3, generator=torch.Generator().manual_seed(4))[:tokens].to(DEVICE)
        return store, store.clone(), slots

    expected, fused_cache = separate(q, k, v, positions, weights, zero_centered, rotary_dim, cache(), norm, rope), cache()
    got = qk_triton.qk_norm_rope(q, k, v, positions, weights, EPS, zero_centered, THETA, MAX_POSITIONS, rotary_dim, fused_cache, norm=norm, rope=rope)
    for name, a, b in zip(("q", "k", "v"), got, expected):  # the stores compared whole: other slots untouched
        differ = (int_view(a) != int_view(b)).flatten()
        assert bitwise_equal(a, b), f"{name}: {int(differ.sum())} of {a.numel()} values differ, first at {differ.nonzero()[:4].flatten().tolist()}"
    if with_cache:
        assert got[1] is fused_cache[0] and got[2] is fused_cache[1]

    control = in_float64(q, positions, weights[0], zero_centered, rotary_dim)
    assert not bitwise_equal(control, got[0])


@pytest.mark.gpu
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_without_a_norm_the_launch_is_the_rotation(rotary_dim):
    norm, rope = constants("bfloat16", 16)
    q, k, v = projected(6, 4, 2, 16, torch.bfloat16, seed=5)
    positions = torch.arange(6, device=DEVICE) * 7
    got = qk_triton.qk_norm_rope(q, k, v, positions, None, EPS, False, THETA, MAX_POSITIONS, rotary_dim, None, norm=norm, rope=rope)
    expected = separate(q, k, v, positions, None, False, rotary_dim, None, norm, rope)
    assert all(bitwise_equal(a, b) for a, b in zip(got, expected)) and got[2] is v
    assert not bitwise_equal(got[0], q)  # the control: positions 7, 14 … rotate every row but the first


def test_the_launch_declines_what_it_cannot_reproduce():
    norm, rope = constants("bfloat16", 16)
    q, k, v = projected(2, 2, 1, 16, torch.bfloat16, seed=6)
    positions, weights = torch.arange(2, device=DEVICE), (torch.ones(16, dtype=torch.bfloat16, device=DEVICE),) * 2
    call = lambda *a, **kw: qk_triton.qk_norm_rope(*a, EPS, False, THETA, MAX_POSITIONS, None, None, **kw)  # noqa: E731
    assert call(q, k, v, positions, weights, norm=None, rope=rope) is None  # a norm wanted, none bound in rms_norm.triton
    assert call(q, k, v, positions, weights, norm=norm, rope={**rope, "output_dtype": "float32"}) is None
    assert call(q.float(), k.float(), v.float(), positions, weights, norm=norm, rope=rope) is None
    assert call(q.detach().clone().requires_grad_(), k, v, positions, weights, norm=norm, rope=rope) is None


def test_the_binding_offers_the_launch_where_the_contract_pins_its_impls():
    spec = PRESETS["tiny-dense"]
    assert QK_NORM_ROPE in bind(fit_contract(load_preset("tiny-dense-triton"), spec), spec, "engine_decode").ops["engine_decode"]
    for preset in ("tiny-dense", "native"):
        assert QK_NORM_ROPE not in bind(fit_contract(load_preset(preset), spec), spec, "engine_decode").ops["engine_decode"]


def test_a_forward_without_autograd_takes_the_launch_with_the_bits_of_one_with_autograd(monkeypatch):
    """trainer_score (no autograd: one launch a layer, no rope kernel) against trainer_fwd (autograd: the
    separate ops), row for row; and a launch bound with another eps must change the rows."""
    spec = PRESETS["tiny-dense"]
    model = init_random(spec, seed=3).to(DEVICE)
    contract = fit_contract(load_preset("tiny-dense-triton"), spec)
    seqs = [[1, 5, 9, 2, 7], [3, 3, 8]]
    fused, rope_kernel = CountingKernel(qk_triton.qk_norm_rope_kernel), CountingKernel(rope_triton.rope_fwd_kernel)
    monkeypatch.setattr(qk_triton, "qk_norm_rope_kernel", fused)
    monkeypatch.setattr(rope_triton, "rope_fwd_kernel", rope_kernel)
    scored = sequence_logprobs(model, contract, seqs, case="trainer_score", device=DEVICE)
    assert (fused.launches, rope_kernel.launches) == (len(spec.layers), 0)
    trained = sequence_logprobs(model, contract, seqs, case="trainer_fwd", device=DEVICE)
    assert rope_kernel.launches == 2 * len(spec.layers) and fused.launches == len(spec.layers)
    assert all(bitwise_equal(a, b.detach()) for a, b in zip(scored, trained))

    launch = qk_triton.qk_norm_rope
    monkeypatch.setattr(qk_triton, "qk_norm_rope", lambda *args, **kw: launch(*args[:5], args[5] + 1e-2, *args[6:], **kw))
    assert not all(bitwise_equal(a, b.detach()) for a, b in zip(sequence_logprobs(model, contract, seqs, case="trainer_score", device=DEVICE), trained))


def test_the_norms_launch_without_fma_contraction(monkeypatch):
    """Contracted, a row's sum of squares leaves the threads one ulp apart (docs/experiments.md): both launches
    that normalise q/k rows ask the compiler for none."""
    options = {}

    class Recording:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: options.setdefault(len(options), kwargs)

    monkeypatch.setattr(rms_norm_triton, "rms_norm_fwd_kernel", Recording())
    monkeypatch.setattr(qk_triton, "qk_norm_rope_kernel", Recording())
    norm, rope = constants("bfloat16", 16)
    q, k, v = projected(2, 2, 1, 16, torch.bfloat16, seed=7)
    rms_norm_triton.rms_norm(q, torch.ones(16, dtype=torch.bfloat16, device=DEVICE), EPS, **norm)
    qk_triton.qk_norm_rope(q, k, v, torch.arange(2, device=DEVICE), None, EPS, False, THETA, MAX_POSITIONS, None, None, norm=norm, rope=rope)
    assert [kwargs["enable_fp_fusion"] for kwargs in options.values()] == [False, False]


PTXAS = pathlib.Path(triton_support.triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(ON_GPU or not PTXAS.exists(), reason="the GPU tests compare the bits themselves; needs Triton's ptxas otherwise")
@pytest.mark.parametrize("head_dim,reduce_block", [(128, 128), (32, 16)])
def test_for_hopper_the_fused_launch_sums_squares_as_rms_norm_does(head_dim, reduce_block, tmp_path):
    """Compiled for sm_90 as the launches specialise them (aligned pointers and strides): the float
    instructions up to each q/k row's square root in the fused launch (its sum of squares, shuffles included,
    the mean and eps) are rms_norm.triton's one for one, with no FMA in either."""
    script = textwrap.dedent(f"""
        import re, triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from isoexec.ops.rms_norm import triton as norm
        from isoexec.ops.rope import qk_triton
        D, RB = {head_dim}, {reduce_block}

        def ptx(kernel, pointers, aligned, ones, constexprs):
            types, attrs = {{}}, {{}}
            for i, name in enumerate(kernel.arg_names):
                if name in constexprs or name in ones:
                    types[name] = "constexpr"
                    constexprs.setdefault(name, 1)
                else:
                    types[name] = pointers.get(name, "fp32" if name == "eps" else "i32")
                    if name in pointers or name in aligned:
                        attrs[(i,)] = [["tt.divisibility", 16]]
            compiled = triton.compile(ASTSource(kernel, types, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                                      options={{"num_warps": 1, "enable_fp_fusion": False}})
            return compiled.asm["ptx"]

        def sums(text):
            ops = re.findall(r"^\\s*(?:@%p\\d+\\s+)?((?:shfl|add|sub|mul|fma|div|sqrt)\\.[\\w.]+)", text, re.M)
            ops = [op for op in ops if op.startswith("shfl") or op.endswith("f32")]
            cuts = [i for i, op in enumerate(ops) if op.startswith("sqrt")]
            return [ops[(cuts[j - 1] + 1 if j else 0) : cut] for j, cut in enumerate(cuts)]

        plain = ptx(norm.rms_norm_fwd_kernel, {{n: "*bf16" for n in ("x", "r", "w", "y", "s")}}, {{"stride_xr", "stride_rr", "stride_yr"}},
                    {{"stride_xh", "stride_rh", "stride_yh"}}, dict(H=D, NH=D // RB, HAS_RESIDUAL=False, ZERO_CENTERED=False, REDUCE_BLOCK=RB))
        pointers = {{n: "*bf16" for n in ("q", "k", "v", "q_out", "k_out", "v_out", "q_w", "k_w")}} | {{"write_slots": "*i64", "positions": "*i64", "table": "*fp32"}}
        strides = {{f"stride_{{a}}{{b}}" for a in ("q", "k", "v", "qo", "ko", "vo") for b in "th"}}
        fused = ptx(qk_triton.qk_norm_rope_kernel, pointers, strides, {{"stride_p", "stride_ci"}},
                    dict(H=16, HKV=8, D=D, BLOCK_D=D, HALF=D // 2, BLOCK_HALF=D // 2, BLOCK_PASS=1, HAS_NORM=True, ZERO_CENTERED=False,
                         NH=D // RB, REDUCE_BLOCK=RB, HAS_SLOTS=True))
        (one,), two = sums(plain), sums(fused)  # the k row's sum follows the q row's rotation
        assert len(two) == 2 and all(s[-len(one):] == one for s in two), (one, two)
        assert any(op.startswith("shfl") for op in one) and not any(op.startswith("fma") for op in one)
        # The control: rms_norm.triton in chunks half as wide reduces otherwise, and the comparison sees it.
        halves = ptx(norm.rms_norm_fwd_kernel, {{n: "*bf16" for n in ("x", "r", "w", "y", "s")}}, {{"stride_xr", "stride_rr", "stride_yr"}},
                     {{"stride_xh", "stride_rh", "stride_yh"}}, dict(H=D, NH=2 * D // RB, HAS_RESIDUAL=False, ZERO_CENTERED=False, REDUCE_BLOCK=RB // 2))
        assert sums(halves)[0] != one
    """)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
