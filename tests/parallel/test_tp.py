"""Tensor parallelism from outside the model (isoexec.parallel), in real gloo processes on the CPU: a
trainer's rows at TP 2 and 4 bitwise equal to one process's; the engine and the trainer at different
TP sizes bitwise equal in the audit; native's composition (each rank's GEMM rounded, then summed by the
collective) differing by construction; gradients through the composed ops matching one process's;
layouts the model or the contract cannot be cut into refused in one line."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from conftest import bitwise_equal, int_view
from isoexec.audit import all_equal, run_audit
from isoexec.contract import fit_contract, load_preset
from isoexec.model import PRESETS, init_random
from isoexec.parallel import check, shard, spawn
from isoexec.trainer import Trainer

SEQUENCES = [[(7 * i + 3 * j) % 500 for j in range(n)] for i, n in enumerate((9, 23, 40))]


def _rows(mesh, contract_name, case):
    contract = load_preset(contract_name)
    model = init_random(PRESETS["tiny-dense"], seed=0)
    local = shard(model, contract, mesh.tp, mesh.rank) if mesh.tp > 1 else model
    return [r.detach() for r in Trainer(local, contract, mesh).logprobs(SEQUENCES, case=case)]


def _differing(a, b) -> int:
    return sum(int((int_view(x) != int_view(y)).sum()) for x, y in zip(a, b))


@pytest.mark.parametrize("case", ["trainer_score", "trainer_fwd"])
def test_trainer_rows_are_the_same_bits_at_every_tp_size(case):
    """TP 2 (two heads, two key/value heads, four leaves a rank) and TP 4 (one head a rank, key/value heads
    replicated, two leaves a rank) against one process: every full-vocabulary row bit for bit."""
    one = _rows_in(1, "tiny-dense", case)
    for tp in (2, 4):
        assert _differing(one, _rows_in(tp, "tiny-dense", case)) == 0, f"TP {tp}"


def _rows_in(tp, contract_name, case="trainer_score"):
    return spawn(tp, _rows, contract_name, case)


def test_native_tensor_parallelism_is_not_the_same_bits():
    """The control: native's o_proj and down_proj at TP 2 are each rank's GEMM over its half of K, rounded to
    bf16, then summed by the collective; one process rounds one GEMM over all of K. Two roundings against one:
    other bits by construction (here every element of every row)."""
    one, two = _rows_in(1, "native"), _rows_in(2, "native")
    assert _differing(one, two) > 0


def _gradients(mesh):
    spec = dataclasses.replace(PRESETS["tiny-dense"], dtype="float32")  # fp32 weights and gradients: a tight tolerance
    contract = fit_contract(load_preset("tiny-dense"), spec)
    model = init_random(spec, seed=0)
    local = shard(model, contract, mesh.tp, mesh.rank) if mesh.tp > 1 else model
    rows = Trainer(local, contract, mesh).logprobs(SEQUENCES, case="trainer_fwd")
    weights = [torch.linspace(-1, 1, r.numel()).view_as(r) for r in rows]
    sum((r * w).sum() for r, w in zip(rows, weights)).backward()
    return {name: p.grad.float() for name, p in local.named_parameters()}


def test_gradients_through_the_composed_ops_match_one_process():
    """Rank 0's shard at TP 2, an fp32 model: the replicated weights' gradients (the embedding, the norms: the
    sum over ranks of the column-parallel inputs' gradients) and its own rows and columns of the sharded
    ones, against one process's, to float tolerance (gradients are reduced by any means)."""
    full, rank0 = _gradients_in(1), _gradients_in(2)
    checks = {
        "model.embed_tokens.weight": lambda g: g,
        "model.layers.0.input_layernorm.weight": lambda g: g,
        "model.layers.1.self_attn.q_proj.weight": lambda g: g[:32],  # heads 0 and 1 of 4, 16 rows each
        "model.layers.1.self_attn.k_proj.weight": lambda g: g[:16],  # key/value head 0 of 2
        "model.layers.1.self_attn.o_proj.weight": lambda g: g[:, :32],
        "model.layers.0.mlp.gate_proj.weight": lambda g: g[:64],
        "model.layers.0.mlp.down_proj.weight": lambda g: g[:, :64],
    }
    for name, part in checks.items():
        want = part(full[name])
        assert rank0[name].shape == want.shape, name
        assert float((rank0[name] - want).norm() / want.norm()) < 1e-5, name


def _gradients_in(tp):
    return spawn(tp, _gradients)


@pytest.mark.parametrize("trainer_tp, engine_tp", [(2, 1), (1, 2), (4, 2)])
def test_the_audit_is_bitwise_across_layouts(trainer_tp, engine_tp):
    """The engine (paged cache, chunked prefill, preemption, prefix caching, sampling) at one TP size, the
    trainer at another: every sampled token and every full-vocabulary row equal."""
    model = init_random(PRESETS["tiny-dense"], seed=0)
    report = run_audit(model, load_preset("tiny-dense"), requests=6, max_new_tokens=8, progress=False, trainer_tp=trainer_tp,
                       engine_tp=engine_tp)
    assert all_equal(report), report["trainer_score"]
    assert report["layout"] == {"trainer": {"tp": trainer_tp}, "engine": {"tp": engine_tp}}


@pytest.mark.parametrize("preset, tp, message", [
    ("tiny-dense", 3, "TP = 3 does not divide contract tiny-dense's 8 row-parallel leaves"),
    ("tiny-dense", 8, "TP = 8 does not divide layer 0's 4 attention heads"),
    ("tiny-moe", 2, "tensor parallelism shards gqa attention and mlp layers so far; layer 1 is gqa + moe"),
])
def test_layouts_that_cannot_be_cut_are_refused(preset, tp, message):
    contract = load_preset("tiny-dense" if preset == "tiny-dense" else "tiny-moe")
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        check(PRESETS[preset], contract, tp)


def test_the_audit_command_refuses_a_bad_layout_in_one_line():
    result = subprocess.run([sys.executable, "-m", "isoexec", "audit", "--engine-tp", "3", "--quiet"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["isoexec: error: --engine-tp 3: TP = 3 does not divide contract tiny-dense's 8 "
                                                  "row-parallel leaves"]


def test_a_rank_model_is_the_single_device_decoder_with_fewer_heads():
    """The plan only reshapes the spec and slices weights: rank 1 of TP 2 is a Decoder with 2 heads and 1
    key/value head a layer and half of each MLP, its q_proj rows the full model's heads 2 and 3."""
    contract = load_preset("tiny-dense")
    model = init_random(PRESETS["tiny-dense"], seed=0)
    rank1 = shard(model, contract, 2, 1)
    attention, mlp = rank1.spec.layers[0].mixer, rank1.spec.layers[0].ffn
    assert (attention.num_heads, attention.num_kv_heads, mlp.intermediate_size) == (2, 1, 64)
    assert bitwise_equal(rank1.model.layers[0].self_attn.q_proj.weight, model.model.layers[0].self_attn.q_proj.weight[32:])
    assert bitwise_equal(rank1.model.layers[0].mlp.down_proj.weight, model.model.layers[0].mlp.down_proj.weight[:, 64:])
    assert rank1.unsharded_spec == model.spec
