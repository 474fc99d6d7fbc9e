"""Sibling projections as one call over joined weights (`ops/linear/joined.py`, `model/layers/params.py`):
each part bitwise its own call, gradients against float64, the model's siblings joined in memory from
construction through conversions and checkpoints, the joined op bound only where every sibling has one
impl and one set of constants, and a model's rows bitwise the same with its weights joined or apart —
next to a control whose joined call regroups its sums, which the same comparison must catch."""

import copy

import pytest
import torch

from conftest import bitwise_equal, preset_dict
from controls import JOINED_CONTROL, control_contract
from isoexec.contract import Contract, fit_contract, load_preset
from isoexec.model import PRESETS, init_random, load, save
from isoexec.ops.linear import reference
from isoexec.ops.linear.joined import joined, joined_op
from isoexec.runtime.binding import bind
from isoexec.trainer import sequence_logprobs

CONSTANTS = dict(input_dtype="float32", weight_dtype="float32", output_dtype="float32", accum_dtype="float32", block_k=8,
                 block_tree="sequential", tree="sequential")


def _rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _siblings(widths, k, seed, bias=True):
    whole_w = _rand(sum(widths), k, seed=seed, dtype=torch.float32) * k**-0.5
    whole_b = _rand(sum(widths), seed=seed + 1) if bias else None
    weights = list(whole_w.split(widths))
    biases = list(whole_b.split(widths)) if bias else [None] * len(widths)
    return weights, biases


def test_joined_takes_consecutive_rows_of_one_storage_only():
    whole = torch.arange(24.0).reshape(6, 4)
    a, b, c = whole[:1], whole[1:3], whole[3:]
    assert bitwise_equal(joined([a, b, c]), whole) and joined([a, b, c]).data_ptr() == whole.data_ptr()
    assert joined([a, c]) is None  # a gap
    assert joined([b, a]) is None  # out of order
    assert joined([a, b.clone()]) is None  # another storage
    assert joined([whole[:, :2], whole[:, 2:]]) is None  # columns, not rows
    assert joined([a, None]) is None


def _linear():
    return lambda x, w, b: reference.linear(x, w, b, **CONSTANTS)


@pytest.mark.parametrize("widths", [[24, 8, 8], [16, 16]])
@pytest.mark.parametrize("bias", [True, False])
def test_reference_parts_are_bitwise_their_own_calls(widths, bias):
    weights, biases = _siblings(widths, 40, seed=1, bias=bias)
    x = _rand(9, 40, seed=3)
    op = joined_op(lambda x, w, b, widths: reference.joined_linear(x, w, b, widths, **CONSTANTS), reference.can_join)
    parts = op(x, weights, biases)
    alone = [_linear()(x, w, b) for w, b in zip(weights, biases)]
    assert len(parts) == len(widths) and all(p.is_contiguous() for p in parts)
    assert all(bitwise_equal(p, a) for p, a in zip(parts, alone))
    # The control's joined call sums K in longer blocks: the comparison sees it.
    control = joined_op(lambda x, w, b, widths: __import__("controls").reordered_joined_linear(x, w, b, widths, **CONSTANTS),
                        reference.can_join)
    assert not all(bitwise_equal(p, a) for p, a in zip(control(x, weights, biases), alone))


def test_not_joined_weights_take_no_joined_call():
    weights, biases = _siblings([16, 8], 40, seed=4)
    op = joined_op(lambda *a: pytest.fail("joined call on weights apart"), reference.can_join)
    assert op(_rand(3, 40, seed=5), [w.clone() for w in weights], biases) is None
    assert op(_rand(3, 40, seed=5), weights, [b.clone() for b in biases]) is None


def test_joined_gradients_match_float64():
    widths = [24, 8, 8]
    weights, biases = _siblings(widths, 40, seed=6)
    whole_w = weights[0].as_strided((sum(widths), 40), (40, 1)).clone().requires_grad_()
    whole_b = biases[0].as_strided((sum(widths),), (1,)).clone().requires_grad_()
    x = _rand(7, 40, seed=8).requires_grad_()
    grads = [_rand(7, w, seed=9 + i) for i, w in enumerate(widths)]
    op = joined_op(lambda x, w, b, widths: reference.joined_linear(x, w, b, widths, **CONSTANTS), reference.can_join)
    parts = op(x, list(whole_w.split(widths)), list(whole_b.split(widths)))
    assert parts is not None
    # the split views are non-leaf: gradients land on the joined leaves through them
    torch.autograd.backward(parts, grads)
    exact_x = x.detach().double().requires_grad_()
    exact_w = whole_w.detach().double().requires_grad_()
    exact_b = whole_b.detach().double().requires_grad_()
    (exact_x @ exact_w.T + exact_b).backward(torch.cat(grads, -1).double())
    for got, want in ((x, exact_x), (whole_w, exact_w), (whole_b, exact_b)):
        assert (got.grad.double() - want.grad).abs().max() < 1e-4


def test_joined_parameters_get_their_own_gradients():
    layer = init_random(PRESETS["tiny-dense"], seed=0).model.layers[0]
    attn = layer.self_attn
    x = _rand(5, attn.q_proj.weight.shape[1], seed=11).to(attn.q_proj.weight.dtype)
    op = joined_op(lambda x, w, b, widths: reference.joined_linear(x, w, b, widths, **{**CONSTANTS, "input_dtype": str(x.dtype)[6:],
                   "weight_dtype": str(x.dtype)[6:], "output_dtype": str(x.dtype)[6:]}), reference.can_join)
    linears = (attn.q_proj, attn.k_proj, attn.v_proj)
    parts = op(x, [l.weight for l in linears], [l.bias for l in linears])
    sum(p.float().square().sum() for p in parts).backward()
    for linear in linears:
        assert linear.weight.grad is not None and linear.weight.grad.shape == linear.weight.shape
        assert linear.weight.grad.abs().sum() > 0


def _is_joined(model) -> bool:
    return all(joined([getattr(layer.self_attn, n).weight for n in ("q_proj", "k_proj", "v_proj")]) is not None
               and joined([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]) is not None for layer in model.model.layers)


def test_model_siblings_stay_joined_through_conversions_and_checkpoints(tmp_path):
    model = init_random(PRESETS["tiny-dense"], seed=0)
    assert _is_joined(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model = model.to(torch.float64)  # converts each parameter apart; the model joins them again
    assert _is_joined(model) and all(bitwise_equal(v.double(), model.state_dict()[k]) for k, v in state.items())
    model = model.to(torch.bfloat16)
    saved = load(save(model, tmp_path / "ckpt"))  # safetensors refuses shared storage: save copies
    assert _is_joined(saved)
    assert all(bitwise_equal(v, saved.state_dict()[k]) for k, v in model.state_dict().items())


def test_the_joined_op_is_bound_only_where_the_impl_can_join():
    spec = PRESETS["tiny-dense"]
    ops = bind(fit_contract(load_preset("tiny-dense"), spec), spec, "trainer_fwd").ops["trainer_fwd"]
    assert {"q_proj+k_proj+v_proj", "gate_proj+up_proj"} <= set(ops)
    ops = bind(fit_contract(control_contract("linear"), spec), spec, "trainer_fwd").ops["trainer_fwd"]  # no joined forward
    assert not {"q_proj+k_proj+v_proj", "gate_proj+up_proj"} & set(ops)


def _with_joined_control(preset="tiny-dense") -> Contract:
    data = copy.deepcopy(preset_dict(preset))
    data["name"] = f"{preset}-control-joined"
    for entry in data["composition"]:
        if entry["impl"]["id"] == "linear.reference":
            entry["impl"] = {"id": JOINED_CONTROL.id, "version": JOINED_CONTROL.version}
        entry["discharge"] = {"method": "none"}
    data["claims"] = {"tolerances": {}}
    return Contract.from_dict(data)


def _apart(model):
    """The model with every sibling's weight in a storage of its own (the same values)."""
    for layer in model.model.layers:
        for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.mlp.gate_proj, layer.mlp.up_proj):
            module.weight.data = module.weight.data.clone()
    return model


@pytest.mark.parametrize("preset", ["tiny-dense", "control"])
def test_model_rows_are_bitwise_the_same_with_weights_joined_or_apart(preset):
    spec = PRESETS["tiny-dense"]
    contract = fit_contract(_with_joined_control() if preset == "control" else load_preset("tiny-dense"), spec)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(spec.vocab_size, (n,), generator=g).tolist() for n in (7, 30)]
    model = init_random(spec, seed=1)
    together = sequence_logprobs(model, contract, seqs)
    apart = sequence_logprobs(_apart(model), contract, seqs)
    assert not _is_joined(model)
    same = all(bitwise_equal(a, b) for a, b in zip(together, apart))
    if preset == "tiny-dense":
        assert same
    else:
        assert not same, "the control's joined call gave the separate calls' bits: this check could not fail"
