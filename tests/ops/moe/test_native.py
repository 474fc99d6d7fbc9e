"""moe.experts.grouped_mm, the fast baseline's experts (transformers 5's default grouped_mm path): the
right values and gradients (float64 within fp32 rounding, idle experts among them), and a model whose
rows torch._grouped_mm cannot take refused when a contract pinning it is fitted, naming the field."""

import dataclasses
from pathlib import Path

import pytest
import torch

from isoexec.contract import fit_contract, load
from isoexec.model import PRESETS, SpecError
from isoexec.ops.moe import native

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch has no _grouped_mm")

FP32 = dict(input_dtype="float32", weight_dtype="float32", output_dtype="float32", accum_dtype="float32", compute_dtype="float32")
FAST_BASELINE = Path(__file__).resolve().parents[3] / "benchmarks" / "contracts" / "fast-baseline.toml"


def _inputs(num_tokens=30, hidden=40, num_experts=6, inter=24, top_k=2):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_tokens, hidden, generator=g)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=g) * 0.2
    down = torch.randn(num_experts, hidden, inter, generator=g) * 0.2
    ids = torch.stack([torch.randperm(num_experts - 2, generator=g)[:top_k] for _ in range(num_tokens)])  # experts 4, 5 idle
    return x, ids, gate_up, down


def float64_experts(x, ids, gate_up, down):
    gate, up = torch.einsum("th,tkih->tki", x.double(), gate_up.double()[ids]).chunk(2, dim=-1)
    return torch.einsum("tki,tkhi->tkh", torch.nn.functional.silu(gate) * up, down.double()[ids])


def test_grouped_mm_experts_match_float64_values_and_gradients():
    x, ids, gate_up, down = (t.requires_grad_() if t.is_floating_point() else t for t in _inputs())
    out = native.experts_grouped_mm(x, ids, gate_up, down, **FP32)
    want = float64_experts(x, ids, gate_up, down)
    assert out.shape == (30, 2, 40) and (out.double() - want).abs().max() < 1e-5 * want.abs().max()
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(out, (x, gate_up, down), g)
    exact = torch.autograd.grad(want, (x, gate_up, down), g.double())
    for a, b in zip(got, exact):
        assert (a.double() - b).abs().max() < 1e-5 * b.abs().max()
    assert not got[1][4:].any(), "idle experts got a gradient"


def test_fitting_the_fast_baseline_refuses_rows_grouped_mm_cannot_take():
    contract = load(str(FAST_BASELINE))
    fitted = fit_contract(contract, PRESETS["tiny-moe"])
    assert fitted.entry("moe.experts", "trainer_fwd").impl.id == "moe.experts.grouped_mm"
    odd = PRESETS["tiny-moe"].replace(layers=tuple(  # 36 bf16 values: 72 bytes a row
        layer if layer.ffn.kind != "moe" else dataclasses.replace(layer, ffn=dataclasses.replace(layer.ffn, moe_intermediate_size=36))
        for layer in PRESETS["tiny-moe"].layers))
    with pytest.raises(SpecError, match="moe_intermediate_size 36: moe.experts.grouped_mm"):
        fit_contract(contract, odd)
