"""The norms after a residual add: the model always calls them fused, (h, residual) -> (normed, h + residual);
a contract pins them in `rms_norm.residual`, or in plain `rms_norm` composed with `residual_add` when
bound. Both forms must give the same bits."""

import dataclasses

import pytest
import torch

from conftest import bitwise_equal, entry_index, fused_norms, mutated, preset_dict, triton_runs_here, unfused_norms
from isoexec.contract import load_preset
from isoexec.model import PRESETS, init_random
from isoexec.contract import fit_contract
from isoexec.runtime.binding import bind
from isoexec.trainer import sequence_logprobs

TINY = PRESETS["tiny-dense"]


def _sequences(spec, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(spec.vocab_size, (n,), generator=g).tolist() for n in lengths]


def _same_rows(model, a, b, seqs, case):
    rows_a = sequence_logprobs(model, a, seqs, case=case)
    rows_b = sequence_logprobs(model, b, seqs, case=case)
    return all(bitwise_equal(x.detach(), y.detach()) for x, y in zip(rows_a, rows_b))


def test_bind_composes_plain_norms_with_the_residual_add():
    composed = fit_contract(load_preset("tiny-dense"), TINY)
    ops = bind(composed, TINY, "engine_decode").ops["engine_decode"]
    g = torch.Generator().manual_seed(0)
    x, residual, weight = (torch.randn(3, TINY.hidden_size, generator=g).bfloat16() for _ in range(3))
    y, s = ops["post_attention_layernorm"](x, residual, weight, 1e-6)
    assert bitwise_equal(s, ops["residual_add"](x, residual)) and bitwise_equal(y, ops["q_norm"](s, weight, 1e-6))
    y, s = ops["input_layernorm"](x, None, weight, 1e-6)
    assert s is x and bitwise_equal(y, ops["q_norm"](x, weight, 1e-6))

    data = preset_dict("tiny-dense")
    without_add = mutated(data, lambda d: d.update(composition=[e for e in d["composition"] if e["region"] != "residual"]))
    with pytest.raises(ValueError, match=r"does not pin op\(s\) residual_add for case trainer_fwd"):
        bind(without_add, TINY, "trainer_fwd").ops["trainer_fwd"]


def test_a_fused_contract_needs_no_residual_add_and_fit_contract_drops_an_unused_one():
    fused = fused_norms(preset_dict("tiny-dense"), "rms_norm.residual.reference")
    assert fused.entry("residual", "trainer_fwd") is None
    assert "residual_add" not in bind(fused, TINY, "trainer_fwd").ops["trainer_fwd"]
    leftover = dataclasses.replace(fused, composition=fused.composition + (load_preset("tiny-dense").entry("residual", "trainer_fwd"),))
    assert fit_contract(leftover, TINY).entry("residual", "trainer_fwd") is None
    assert fit_contract(load_preset("tiny-dense"), TINY).entry("residual", "trainer_fwd") is not None


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_fused_reference_gives_the_bits_of_the_composed_reference(dtype):
    spec = dataclasses.replace(TINY, dtype=dtype)
    model = init_random(spec, seed=1)
    composed = fit_contract(load_preset("tiny-dense"), spec)
    fused = fit_contract(fused_norms(preset_dict("tiny-dense"), "rms_norm.residual.reference"), spec)
    seqs = _sequences(spec, [7, 19, 3])
    assert _same_rows(model, composed, fused, seqs, "trainer_score") and _same_rows(model, composed, fused, seqs, "trainer_fwd")
    # The check can fail: a fused norm reducing each row by another tree gives other fp32 bits (a bf16
    # output hides most one-ulp changes).
    plain = preset_dict("tiny-dense")["composition"][entry_index(preset_dict("tiny-dense"), "rms_norm")]["constants"]
    other = fit_contract(fused_norms(preset_dict("tiny-dense"), "rms_norm.residual.reference", {**plain, "block_tree": "sequential"}), spec)
    if dtype == "float32":
        assert not _same_rows(model, composed, other, seqs, "trainer_score")


@pytest.mark.skipif(not triton_runs_here(), reason="no GPU, and Triton is missing or was imported before TRITON_INTERPRET=1 was set")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_tiny_dense_triton_gives_the_bits_of_the_unfused_triton_composition():
    """The shipped fused preset against the same contract with the add and the norm as two kernels."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = init_random(TINY, seed=2).to(device)
    fused = fit_contract(load_preset("tiny-dense-triton"), TINY)
    residual = dict(input_dtype="bfloat16", output_dtype="bfloat16", compute_dtype="float32")
    unfused = fit_contract(unfused_norms(preset_dict("tiny-dense-triton"), "residual.triton", residual), TINY)
    assert fused.entry("residual", "trainer_fwd") is None and unfused.entry("rms_norm.residual", "trainer_fwd") is None
    seqs = _sequences(TINY, [4, 7])
    for case in ("trainer_score", "trainer_fwd"):
        a = sequence_logprobs(model, fused, seqs, case=case, device=device)
        b = sequence_logprobs(model, unfused, seqs, case=case, device=device)
        assert all(bitwise_equal(x.detach(), y.detach()) for x, y in zip(a, b)), case
    rows = sequence_logprobs(model, fused, seqs, case="trainer_fwd", device=device)
    sum(r[:, 0].sum() for r in rows).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
