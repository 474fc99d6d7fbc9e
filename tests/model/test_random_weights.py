"""Seeded random weights: each DRAW_BLOCK of a parameter from its own generator, drawn on several threads."""

import torch

from conftest import bitwise_equal
from isoexec.model import PRESETS, init_random
from isoexec.model import weights
from isoexec.model.weights import block_seed, random_weights

SPEC = PRESETS["tiny-moe"]  # expert tensors of thousands of elements: many blocks each below


def _drawn(seed=3, workers=1):
    return dict(random_weights(SPEC, seed, workers=workers))


def test_the_thread_count_never_changes_a_value(monkeypatch):
    monkeypatch.setattr(weights, "DRAW_BLOCK", 100)  # weights of many blocks, some ending mid-row
    one, three = _drawn(workers=1), _drawn(workers=3)
    assert one.keys() == three.keys() and all(bitwise_equal(one[name], three[name]) for name in one)
    assert max(v.numel() for v in one.values()) > 50 * 100
    # The control: blocks of another size cut the weights into other streams, and the comparison sees it.
    monkeypatch.setattr(weights, "DRAW_BLOCK", 128)
    other = _drawn(workers=3)
    assert not bitwise_equal(other["model.layers.1.mlp.experts.down_proj"], one["model.layers.1.mlp.experts.down_proj"])


def test_a_block_is_its_own_generators_draw(monkeypatch):
    """Block 2 of a weight is 0.05 x the normals of generator `block_seed(seed, name, 2)`, rounded once; a norm
    weight's are 1 + 0.1 x: a rank can tell what it will draw without drawing anything else."""
    monkeypatch.setattr(weights, "DRAW_BLOCK", 100)
    drawn = _drawn()
    for name, scale, shift in (("model.layers.1.mlp.experts.gate_up_proj", 0.05, 0.0), ("model.norm.weight", 0.1, 1.0)):
        normals = torch.randn(100, generator=torch.Generator().manual_seed(block_seed(3, name, 0 if "norm" in name else 2)))
        block = slice(0, 64) if "norm" in name else slice(200, 300)  # the norm weight is one short block
        expected = (shift + scale * normals[: block.stop - block.start]).to(drawn[name].dtype)
        assert bitwise_equal(drawn[name].reshape(-1)[block], expected), name


def test_init_random_loads_the_drawn_weights_and_the_seed_moves_them():
    model, drawn = init_random(SPEC, seed=3), _drawn(workers=2)
    state = model.state_dict()
    assert all(bitwise_equal(state[name], values) for name, values in drawn.items())
    assert not bitwise_equal(init_random(SPEC, seed=4).state_dict()["model.norm.weight"], state["model.norm.weight"])
