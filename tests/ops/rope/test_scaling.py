"""rope's YaRN scaling (src/isoexec/ops/rope/scaling.py): its frequencies, attention factor and softmax
mscale against transformers' own on a DeepSeek-V3 config and against a float64 formula; the reference's
table with it against float64 (and the plain table's bits unchanged); native against transformers'
applied rope; reading Hugging Face rope dicts and refusing the rest in one line naming the field."""

import dataclasses
import math

import pytest
import torch

from conftest import bitwise_equal
from isoexec.ops.rope import native as rope_native, reference as rope_reference, scaling
from isoexec.ops.rope.scaling import Yarn

ROPE = dict(table_dtype="float32", compute_dtype="float32", table_build="cpu_float64")

# (rope dict, theta, rotary_dim, max_position_embeddings)
CASES = {
    "deepseek-v3": (dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=1.0,
                         mscale_all_dim=1.0), 10_000.0, 64, 163_840),
    "qwen3": (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32_768), 1_000_000.0, 128, 131_072),
    "untruncated, attention_factor given": (dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=2048, beta_fast=16.0,
                                                 beta_slow=2.0, attention_factor=0.9, truncate=False), 10_000.0, 32, 16_384),
    "mscale_all_dim alone": (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512, mscale_all_dim=0.707), 50_000.0, 16, 2048),
}


def hf_config(rope: dict, theta: float, rotary_dim: int, max_positions: int, key: str = "rope_parameters"):
    """A small transformers DeepseekV3Config whose rotary embedding is `rope`, as 5's rope_parameters or the
    older rope_scaling."""
    transformers = pytest.importorskip("transformers")
    fields = {"rope_parameters": {"rope_theta": theta, **rope}} if key == "rope_parameters" else {"rope_scaling": dict(rope), "rope_theta": theta}
    return transformers.DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                         topk_group=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=rotary_dim, qk_nope_head_dim=16,
                                         v_head_dim=16, max_position_embeddings=max_positions, **fields)


def yarn_inv_freq_float64(theta: float, rotary_dim: int, yarn: Yarn) -> torch.Tensor:
    """YaRN's inverse frequencies dim by dim in Python floats: theta^(-2i/d) / factor where the ramp is 1,
    theta^(-2i/d) where it is 0."""
    def dim_of(rotations):
        return rotary_dim * math.log(yarn.original_max_position_embeddings / (2 * math.pi * rotations)) / (2 * math.log(theta))

    low, high = dim_of(yarn.beta_fast), dim_of(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    values = []
    for i in range(rotary_dim // 2):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        values.append(theta ** (-2 * i / rotary_dim) * (ramp / yarn.factor + 1 - ramp))
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("case", CASES)
def test_yarn_matches_transformers(case, key):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    rope, theta, rotary_dim, max_positions = CASES[case]
    rope = rope if key == "rope_parameters" else {"type" if k == "rope_type" else k: v for k, v in rope.items()}
    config = hf_config(rope, theta, rotary_dim, max_positions, key)
    their_inv_freq, their_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    yarn = scaling.yarn_from_config(rope, key)
    assert bitwise_equal(scaling.inv_freq(theta, rotary_dim, yarn, torch.float32), their_inv_freq)  # native's numerics
    ours = scaling.inv_freq(theta, rotary_dim, yarn)
    assert ours.dtype == torch.float64 and ours.device.type == "cpu"
    assert ((ours - their_inv_freq.double()).abs() <= 4 * 2**-24 * ours).all()  # theirs is fp32
    assert scaling.attention_factor(yarn) == their_factor
    assert scaling.softmax_mscale(yarn) == yarn_apply_mscale(config.rope_parameters, 1.0)


@pytest.mark.parametrize("case", CASES)
def test_yarn_inv_freq_matches_a_float64_formula(case):
    rope, theta, rotary_dim, _ = CASES[case]
    yarn = scaling.yarn_from_config(rope, "rope_parameters")
    exact = yarn_inv_freq_float64(theta, rotary_dim, yarn)
    assert ((scaling.inv_freq(theta, rotary_dim, yarn) - exact).abs() <= 1e-12 * exact).all()


def test_deepseek_v3_factors():
    yarn = Yarn(factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)
    assert scaling.attention_factor(yarn) == 1.0  # mscale / mscale_all_dim
    assert scaling.softmax_mscale(yarn) == pytest.approx((0.1 * math.log(40.0) + 1.0) ** 2, rel=1e-15)
    assert scaling.attention_factor(None) == scaling.softmax_mscale(None) == 1.0
    assert scaling.attention_factor(Yarn(4.0, 512, mscale_all_dim=0.0)) == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-15)
    assert scaling.get_mscale(0.5, 3.0) == scaling.get_mscale(1.0) == 1.0


def cos_sin_table_as_before(theta, rotary_dim, max_positions, table_dtype):
    """The reference's table as it was built before frequency scaling."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    inv_freq = 1.0 / (torch.tensor(theta, dtype=torch.float64) ** exponents)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.stack([angles.cos(), angles.sin()], dim=-1).to(getattr(torch, table_dtype))


@pytest.mark.parametrize("table_dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("theta,rotary_dim", [(10_000.0, 16), (1_000_000.0, 128), (500_000.0, 64), (12_345.678, 10)])
def test_plain_table_bits_are_unchanged(theta, rotary_dim, table_dtype):
    before = cos_sin_table_as_before(theta, rotary_dim, 4096, table_dtype)
    assert bitwise_equal(rope_reference.cos_sin_table(theta, rotary_dim, 4096, table_dtype, "cpu"), before)
    assert bitwise_equal(rope_reference.cos_sin_table(theta, rotary_dim, 4096, table_dtype, "cpu", None), before)


@pytest.mark.parametrize("case", CASES)
def test_yarn_table_is_float64_cos_sin_times_the_attention_factor(case):
    rope, theta, rotary_dim, max_positions = CASES[case]
    yarn = scaling.yarn_from_config(rope, "rope_parameters")
    table = rope_reference.cos_sin_table(theta, rotary_dim, 8192, "float64", "cpu", yarn)
    angles = torch.arange(8192, dtype=torch.float64)[:, None] * yarn_inv_freq_float64(theta, rotary_dim, yarn)
    exact = torch.stack([angles.cos(), angles.sin()], dim=-1) * scaling.attention_factor(yarn)
    assert (table - exact).abs().max() < 1e-9
    short = rope_reference.cos_sin_table(theta, rotary_dim, 100, "float32", "cpu", yarn)
    assert bitwise_equal(short, rope_reference.cos_sin_table(theta, rotary_dim, 8192, "float32", "cpu", yarn)[:100])


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_reference_rope_with_yarn_matches_a_float64_rotation(rotary_dim):
    yarn = Yarn(factor=4.0, original_max_position_embeddings=512)
    g = torch.Generator().manual_seed(0)
    x, pos = torch.randn(30, 2, 16, generator=g), torch.randint(0, 4096, (30,), generator=g)
    got = rope_reference.rope(x, pos, 10_000.0, 4096, rotary_dim, yarn, input_dtype="float32", output_dtype="float32", **ROPE).double()
    rot = rotary_dim or 16
    angle = pos.double()[:, None, None] * yarn_inv_freq_float64(10_000.0, rot, yarn)
    cos, sin = angle.cos() * scaling.attention_factor(yarn), angle.sin() * scaling.attention_factor(yarn)
    x1, x2 = x[..., : rot // 2].double(), x[..., rot // 2 : rot].double()
    exact = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rot:].double()], -1)
    assert (got - exact).abs().max() < 1e-5
    if rotary_dim:
        assert bitwise_equal(got[..., rot:].float(), x[..., rot:])


def test_reference_rope_gradients_with_yarn_match_float64_finite_differences():
    yarn = Yarn(factor=4.0, original_max_position_embeddings=32, mscale_all_dim=0.5)
    constants = dict(input_dtype="float64", output_dtype="float64", table_dtype="float64", compute_dtype="float64", table_build="cpu_float64")
    x = torch.randn(3, 2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: rope_reference.rope(x, torch.tensor([0, 5, 63]), 500.0, 64, None, yarn, **constants), (x,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", ["deepseek-v3", "mscale_all_dim alone"])
def test_native_with_yarn_is_transformers_rope(case, dtype):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3

    rope, theta, rotary_dim, max_positions = CASES[case]
    rotary_embedding = modeling_deepseek_v3.DeepseekV3RotaryEmbedding(hf_config(rope, theta, rotary_dim, max_positions))
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(20, 3, rotary_dim, generator=g).to(dtype), torch.randint(0, max_positions, (20,), generator=g)
    cos, sin = rotary_embedding(x, pos[None])
    q = x.transpose(0, 1)[None]  # [1, H, T, D]
    theirs = modeling_deepseek_v3.apply_rotary_pos_emb(q, q, cos, sin)[0][0].transpose(0, 1)
    yarn, name = scaling.yarn_from_config(rope, "rope_parameters"), str(dtype).removeprefix("torch.")
    native = rope_native.rope(x, pos, theta, max_positions, rotary_dim, yarn, input_dtype=name, output_dtype=name)
    assert bitwise_equal(native, theirs)  # the same ops in the same order, on the CPU
    ours = rope_reference.rope(x, pos, theta, max_positions, rotary_dim, yarn, input_dtype=name, output_dtype=name, **ROPE)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2**-6, atol=2**-6)


def test_native_without_scaling_is_unchanged():
    g = torch.Generator().manual_seed(2)
    x, pos = torch.randn(20, 2, 16, generator=g).bfloat16(), torch.randint(0, 4096, (20,), generator=g)
    inv_freq = 1.0 / (10_000.0 ** (torch.arange(0, 16, 2, dtype=torch.int64).float() / 16))
    angles = torch.cat([pos.float()[:, None] * inv_freq] * 2, -1)
    cos, sin = angles.cos().bfloat16()[:, None], angles.sin().bfloat16()[:, None]
    expected = x * cos + torch.cat([-x[..., 8:], x[..., :8]], -1) * sin
    assert bitwise_equal(rope_native.rope(x, pos, 10_000.0, 4096, input_dtype="bfloat16", output_dtype="bfloat16"), expected)


def test_yarn_is_a_frozen_hashable_cache_key():
    yarn = Yarn(factor=40.0, original_max_position_embeddings=4096)
    assert hash(yarn) == hash(Yarn(40.0, 4096)) and yarn == Yarn(40.0, 4096)
    with pytest.raises(dataclasses.FrozenInstanceError):
        yarn.factor = 2.0
    assert rope_reference.cos_sin_table(1e4, 16, 64, "float32", "cpu", yarn) is rope_reference.cos_sin_table(1e4, 16, 64, "float32", "cpu", Yarn(40.0, 4096))
    assert not bitwise_equal(rope_reference.cos_sin_table(1e4, 16, 64, "float32", "cpu", yarn), rope_reference.cos_sin_table(1e4, 16, 64, "float32", "cpu"))


@pytest.mark.parametrize("rope", [None, {}, {"rope_type": "default", "rope_theta": 1e6}, {"type": "default"}, {"rope_theta": 1e4}])
def test_yarn_from_config_reads_the_default_rope_as_none(rope):
    assert scaling.yarn_from_config(rope, "rope_parameters") is None


def test_yarn_from_config_reads_deepseek_v3s_rope_scaling():
    rope = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}
    assert scaling.yarn_from_config(rope, "rope_scaling") == Yarn(40.0, 4096, 32.0, 1.0, 1.0, 1.0, None, True)
    assert scaling.yarn_from_config({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, "rope_parameters") == Yarn(
        4.0, 32768, mscale=0.0)


@pytest.mark.parametrize("rope,source,message", [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_parameters", r"rope_parameters\.rope_type: 'dynamic' is not supported \(default, yarn\)"),
    ({"type": "linear", "factor": 2.0}, "config.json rope_scaling", r"config\.json rope_scaling\.type: 'linear' is not supported \(default, yarn\)"),
    ({"rope_type": "yarn", "rope_theta": 1e4}, "rope_parameters", r"rope_parameters: rope type 'yarn' needs factor and original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 40}, "rope_parameters", r"rope_parameters: rope type 'yarn' needs original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": "40", "original_max_position_embeddings": 4096}, "rope_parameters", r"rope_parameters\.factor: '40' is not a number"),
    ({"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096.5}, "rope_parameters",
     r"rope_parameters\.original_max_position_embeddings: 4096\.5 is not an int"),
    ({"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_slow": [1]}, "rope_parameters",
     r"rope_parameters\.beta_slow: \[1\] is not a number"),
    ({"rope_type": "yarn", "factor": -1.0, "original_max_position_embeddings": 4096}, "rope_parameters", r"rope_parameters: Yarn\.factor must be > 0, got -1\.0"),
])
def test_yarn_from_config_refuses_in_one_line_naming_the_field(rope, source, message):
    with pytest.raises(ValueError, match=f"^{message}$") as error:
        scaling.yarn_from_config(rope, source)
    assert "\n" not in str(error.value)


def test_yarn_refuses_values_it_cannot_use():
    for fields, message in [(dict(factor=0.0), "Yarn.factor must be > 0"), (dict(original_max_position_embeddings=4096.0), "must be an int"),
                            (dict(beta_slow=-1.0), "Yarn.beta_slow must be > 0"), (dict(attention_factor=0.0), "Yarn.attention_factor must be > 0")]:
        with pytest.raises(ValueError, match=message):
            Yarn(**{"factor": 4.0, "original_max_position_embeddings": 4096, **fields})
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        scaling.inv_freq(1e4, 7, None)
