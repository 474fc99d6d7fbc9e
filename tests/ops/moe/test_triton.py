"""The Triton MoE impls (router, grouped experts, combine): the reference's routing (ties to the lower
expert id, group-limited selection), float64 agreement of values and gradients, bitwise invariance of a
token's rows alone vs in batches (every token on one expert, idle experts, a large batch) next to a
control that rounds its input once batched, and the battery's admission of all three under
tiny-moe-triton. Without a GPU they run in Triton's interpreter, on small shapes; on a GPU the engine's
captured decode graphs and the trainer give one model's bits too.
"""

import functools
import subprocess
import sys

import pytest
import torch

from conftest import BATTERY_DTYPES, DEVICE, INTERPRETER_WARNINGS, ON_GPU, batch_dependent, bitwise_equal, hazards, randn, require_triton

require_triton()

from isoexec.contract import fit_contract, load_preset  # noqa: E402
from isoexec.model import PRESETS  # noqa: E402
from isoexec.ops.moe import experts_triton, probe, reference  # noqa: E402
from isoexec.ops.moe import triton as moe_triton  # noqa: E402
from isoexec.runtime.registry import REGISTRY  # noqa: E402
from isoexec.validate.battery import validate_entry  # noqa: E402

pytestmark = [INTERPRETER_WARNINGS, pytest.mark.gpu]

FP32 = dict(input_dtype="float32", weight_dtype="float32", accum_dtype="float32")
ROUTER = dict(FP32, block_t=16, block_k=16, num_warps=4)
REFERENCE_GEMM = dict(FP32, block_k=16, block_tree="balanced_binary", tree="sequential")
# block_n as tiny-moe-triton pins it: the interpreter runs every program, and blocks of 16 columns gave twice
# as many; block_k 16 keeps several K blocks and a partial last one for both GEMMs (H = 40, I = 24).
EXPERTS = dict(FP32, output_dtype="float32", compute_dtype="float32", block_m=16, block_n=32, block_k=16, num_warps=4, num_stages=2)
COMBINE = dict(input_dtype="float32", output_dtype="float32", accum_dtype="float32", block_t=16, block_h=16, num_warps=4)
ROUTINGS = {
    "softmax top-2": (None, 2, "softmax", True),
    "softmax top-1, unnormalised": (None, 1, "softmax", False),
    "sigmoid, bias, 4 groups keep 2, top-3, scaled": ("bias", 3, "sigmoid", True, 4, 2, 2.5),
}


def _routing(name, num_experts):
    args = ROUTINGS[name]
    return (randn(num_experts, seed=5, scale=0.1) if args[0] == "bias" else None, *args[1:])


def _router_inputs(num_tokens=37, hidden=40, num_experts=12):
    x = torch.cat([randn(num_tokens, hidden, seed=1, scale=2.0), hazards(hidden)])
    gate = randn(num_experts, hidden, seed=2, scale=0.3)
    gate[3] = gate[1]  # experts 1 and 3 tie at every token
    return x, gate


@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_router_picks_the_references_experts(routing):
    """Same experts in the same slots as the reference (ties to the lower id, group-limited selection),
    weights within fp32 rounding of its own; the hazard rows (NaN scores) leave the ids valid."""
    x, gate = _router_inputs()
    args = _routing(routing, gate.shape[0])
    weights, ids = moe_triton.router(x, gate, *args, **ROUTER)
    want_weights, want_ids = reference.router(x[:37], gate, *args, **REFERENCE_GEMM)
    assert torch.equal(ids[:37], want_ids)
    assert (weights[:37] - want_weights).abs().max() < 1e-6
    assert ids.dtype == torch.int64 and bool(((ids >= 0) & (ids < gate.shape[0])).all())
    if args[0] is None:  # without bias (and groups) experts 1 and 3 tie: 3 is never taken without 1
        assert not bool(((ids == 3).any(-1) & ~(ids == 1).any(-1)).any()), "a tie went to the higher expert id"


def _packed_router(args, constants=ROUTER):
    def call(x, gate):
        weights, ids = moe_triton.router(x, gate, *args, **constants)
        return torch.cat([weights, ids.to(weights.dtype)], dim=-1)

    return call


def _rounded_when_batched(fn, constants):
    """`fn` whose input x is rounded to bf16 once the batch has 4 or more rows: a batch-dependent op
    (the control) on any device, since the fp32 test inputs are not bf16 values."""

    def call(x, *rest):
        return fn(x.bfloat16().float() if x.shape[0] >= 4 else x, *rest, **constants)

    return call


@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_router_rows_are_bitwise_invariant(routing):
    x, gate = _router_inputs()
    args = _routing(routing, gate.shape[0])
    assert batch_dependent(_packed_router(args), [x], gate) == []
    control = _rounded_when_batched(lambda x, gate, **c: _packed_router(args, c)(x, gate), ROUTER)
    # The control's first 7 rows (random, so not bf16 values) suffice: its batch of 7 is rounded.
    assert batch_dependent(control, [x[:7]], gate), "the invariance check missed a batch-dependent router"


def _experts_inputs(num_tokens=37, hidden=40, num_experts=6, inter=24, top_k=2, dtype=torch.float32):
    x = torch.cat([randn(num_tokens, hidden, seed=3), hazards(hidden)]).to(dtype)
    gate_up = randn(num_experts, 2 * inter, hidden, seed=4, scale=0.2, dtype=dtype)
    down = randn(num_experts, hidden, inter, seed=6, scale=0.2, dtype=dtype)
    g = torch.Generator().manual_seed(7)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(x.shape[0])]).to(DEVICE)
    return x, ids, gate_up, down


def experts_float64(x, ids, gate_up, down):
    x, gate_up, down = x.double(), gate_up.double(), down.double()
    gate, up = torch.einsum("th,tkih->tki", x, gate_up[ids]).chunk(2, dim=-1)
    return torch.einsum("tki,tkhi->tkh", torch.nn.functional.silu(gate) * up, down[ids])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_experts_match_float64(dtype, tol):
    x, ids, gate_up, down = _experts_inputs(dtype=dtype)
    x = x[:37]  # finite rows only
    name = str(dtype).removeprefix("torch.")
    out = experts_triton.experts(x, ids[:37], gate_up, down, **{**EXPERTS, "input_dtype": name, "weight_dtype": name})
    want = experts_float64(x, ids[:37], gate_up, down)
    assert out.shape == (37, 2, 40) and out.dtype == torch.float32
    assert (out.double() - want).abs().max() < tol * want.abs().max()


@pytest.mark.parametrize("spread", ["spread", "one expert"])
def test_experts_rows_are_bitwise_invariant(spread):
    """Alone vs in batches, each token's rows the same bits, whether the tokens spread over the experts or
    all take experts 4 and 0 (1, 2, 3, 5 idle); the control rounds its input once batched."""
    x, ids, gate_up, down = _experts_inputs(num_tokens=13)
    if spread == "one expert":
        ids = torch.tensor([[4, 0]], device=DEVICE).expand(x.shape[0], 2).contiguous()
    op = functools.partial(experts_triton.experts, **EXPERTS)
    assert batch_dependent(op, [x, ids], gate_up, down) == []
    # The control's first 7 rows (random, so not bf16 values) suffice: its batch of 7 is rounded.
    assert batch_dependent(_rounded_when_batched(experts_triton.experts, EXPERTS), [x[:7], ids[:7]], gate_up, down)


def test_experts_rows_among_many_tokens_keep_their_bits():
    """13 probe tokens alone, then as the first of 400 (about 130 rows an expert): the same bits."""
    x, ids, gate_up, down = _experts_inputs(num_tokens=13)
    more_x, more_ids, _, _ = _experts_inputs(num_tokens=400)
    alone = torch.cat([experts_triton.experts(x[i : i + 1], ids[i : i + 1], gate_up, down, **EXPERTS) for i in range(x.shape[0])])
    many = experts_triton.experts(torch.cat([x, more_x]), torch.cat([ids, more_ids]), gate_up, down, **EXPERTS)
    assert bitwise_equal(alone, many[: x.shape[0]])


def test_combine_sums_in_ascending_expert_id():
    """Both sum weight × row in ascending expert id in fp32, whatever the slot order; with a shared expert
    (ungated, so no exp is involved) too. In the interpreter that is the reference's bits; compiled, each
    weight × row + sum is one FMA (the compiler contracts them), so the reference's bits only within an
    ulp of each term, and the slot order still does not matter."""
    g = torch.Generator().manual_seed(8)
    routed, weights = randn(50, 3, 16, seed=9), randn(50, 3, seed=10).abs()
    ids = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(50)]).to(DEVICE)
    shared = randn(50, 16, seed=11)
    constants = {k: v for k, v in COMBINE.items() if k in ("input_dtype", "output_dtype", "accum_dtype")}
    for extra in ((), (shared,)):
        want = reference.combine(routed, weights, ids, *extra, **constants)
        out = moe_triton.combine(routed, weights, ids, *extra, **COMBINE)
        assert bitwise_equal(out, want) if not ON_GPU else (out - want).abs().max() < 1e-5
        perm = torch.tensor([2, 0, 1], device=DEVICE)
        assert bitwise_equal(moe_triton.combine(routed[:, perm], weights[:, perm], ids[:, perm], *extra, **COMBINE), out)


def test_combine_with_a_gated_shared_expert_matches_float64():
    g = torch.Generator().manual_seed(12)
    routed, weights, shared, gate = randn(20, 4, 24, seed=13), randn(20, 4, seed=14).abs(), randn(20, 24, seed=15), randn(20, 1, seed=16, scale=3.0)
    ids = torch.stack([torch.randperm(8, generator=g)[:4] for _ in range(20)]).to(DEVICE)
    out = moe_triton.combine(routed, weights, ids, shared, gate, **COMBINE)
    want = (routed.double() * weights.double()[..., None]).sum(1) + torch.sigmoid(gate.double()) * shared.double()
    assert (out.double() - want).abs().max() < 1e-5


def test_gradients_match_float64():
    x, ids, gate_up, down = _experts_inputs(num_tokens=20)
    x = x[:20].clone().requires_grad_()
    gate_up, down = gate_up.clone().requires_grad_(), down.clone().requires_grad_()
    g = randn(20, 2, 40, seed=17)
    experts_triton.experts(x, ids[:20], gate_up, down, **EXPERTS).backward(g)
    exact = [t.detach().double().requires_grad_() for t in (x, gate_up, down)]
    experts_float64(exact[0], ids[:20], exact[1], exact[2]).backward(g.double())
    for got, want in zip((x, gate_up, down), exact):
        assert (got.grad.double() - want.grad).abs().max() < 1e-5

    xr, gate = _router_inputs(num_tokens=20)
    xr, gate = xr[:20].clone().requires_grad_(), gate.clone().requires_grad_()
    weights, ids = moe_triton.router(xr, gate, None, 3, "sigmoid", True, 1, 1, 2.0, **ROUTER)
    gw = randn(*weights.shape, seed=18)
    weights.backward(gw)
    x64, w64 = xr.detach().double().requires_grad_(), gate.detach().double().requires_grad_()
    s = torch.sigmoid(x64 @ w64.T).gather(-1, ids)
    (2.0 * s / s.sum(-1, keepdim=True)).backward(gw.double())
    assert (xr.grad.double() - x64.grad).abs().max() < 1e-5 and (gate.grad.double() - w64.grad).abs().max() < 1e-5


def test_the_two_expert_gradient_paths_agree():
    """grads.experts_grads (torch._grouped_mm, where torch has it) and its per-expert fallback give the
    same gradients to fp32 rounding, with idle experts (zero-row groups) among them."""
    from isoexec.ops.moe import grads

    x, ids, gate_up, down = _experts_inputs(num_tokens=20)
    ids = torch.where(ids == 5, 4, ids)  # expert 5 idle (a token may then take 4 twice: still a valid routing for the FFN)
    g = randn(x.shape[0], 2, 40, seed=19)
    x = x[:20]
    grouped = grads.experts_grads(x, ids[:20], gate_up, down, g[:20], (True, True, True))
    per_expert = grads.experts_grads_per_expert(x, ids[:20], gate_up, down, g[:20], (True, True, True))
    for a, b in zip(grouped, per_expert):
        assert (a - b).abs().max() < 1e-4 * b.abs().max()
    assert not bool(grouped[2][5].any()) and grads.experts_grads(x, ids[:20], gate_up, down, g[:20], (False, True, False))[0] is None


def test_the_fused_swiglu_backward_matches_torchs():
    """grads.swiglu_grads by activation.triton's kernels (the GPU's path) and by torch ops agree to fp32
    rounding, on a strided gate and up (views of the forward's [R, 2I] pre-activations)."""
    from isoexec.ops.moe import grads

    pre, d_act = randn(29, 48, seed=20, scale=3.0), randn(29, 24, seed=21)
    gate, up = pre.chunk(2, dim=-1)
    for fused, plain in zip(grads.swiglu_grads(gate, up, d_act, fused=True), grads.swiglu_grads(gate, up, d_act, fused=False)):
        assert (fused - plain).abs().max() < 1e-5 * plain.abs().max()


def test_the_battery_admits_the_triton_moe_impls():
    """Under tiny-moe-triton fitted to tiny-moe, the reduced probes' trials all pass (in bfloat16 and float32 on
    a GPU, float32 in the interpreter). (Validating on a GPU adds trials at the model's MoE shape:
    `validate.geometry_of`.)"""
    contract = fit_contract(load_preset("tiny-moe-triton"), PRESETS["tiny-moe"])
    small = dict(count=6, sizes=(1, 3, 12))  # 6 rows and the 6 hazard rows: the last batch is all 12 of them
    probes = {"moe.router": functools.partial(probe.router, large=60, **small),
              "moe.experts": functools.partial(probe.experts, large=60, **small),
              "moe.combine": functools.partial(probe.combine, **small)}
    for region, fn in probes.items():
        entry = contract.entry(region, "trainer_fwd")
        assert entry.impl.id == f"{region}.triton"
        result = validate_entry(contract, entry, fn, registry=REGISTRY, device=DEVICE, dtypes=BATTERY_DTYPES)
        assert result.status == "admitted", (region, result.failures[:3])
        assert result.dtypes == BATTERY_DTYPES and result.trials > 15, (region, result.trials)


def test_without_triton_no_triton_moe_impl_registers():
    script = ("import sys; sys.modules['triton'] = None\n"
              "from isoexec.runtime.registry import Registry\nimport isoexec.ops.moe as moe\n"
              "registry = Registry(); moe.register(registry)\n"
              "ids = sorted(i.id for i in registry)\n"
              "assert ids and not any(i.endswith('.triton') for i in ids), ids\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not ON_GPU, reason="captures CUDA graphs")
def test_tiny_moe_on_the_gpu_engine_graphs_and_trainer_agree():
    """On a GPU: tiny-moe under tiny-moe-triton, engine decode captured as CUDA graphs; every sampled
    token's log-prob and full row equal the trainer's bits (the audit); native differs somewhere."""
    from isoexec.audit.run import all_equal, run_audit
    from isoexec.model import init_random

    model = init_random(PRESETS["tiny-moe"], seed=0).to("cuda")
    contract = fit_contract(load_preset("tiny-moe-triton"), model.spec, device="cuda")
    report = run_audit(model, contract, requests=8, max_new_tokens=8, device="cuda", progress=False)
    assert all_equal(report), report["trainer_score"]
    native = run_audit(model, fit_contract(load_preset("native"), model.spec, device="cuda"), requests=8, max_new_tokens=8,
                       device="cuda", progress=False)
    assert not all_equal(native)
