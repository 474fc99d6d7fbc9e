"""The Hopper tuning rules of the row, log-prob, MoE and MLA kernels (ops/*/tuning.py): every shape gets
constants its impl accepts, the shapes that were timed keep the constants they were timed with, and
fit_contract gives a model the rule's constants at its own shapes (the 9B- and 35B-A3B-shaped presets
included, which no list named)."""

import pytest

from isoexec.contract import fit_contract, load_preset
from isoexec.model import PRESETS
from isoexec.model.spec import MoESpec
from isoexec.ops.logprobs import tuning as logprobs_tuning
from isoexec.ops.mla import tuning as mla_tuning
from isoexec.ops.moe import tuning as moe_tuning
from isoexec.ops.rms_norm import tuning as rms_norm_tuning

pytest.importorskip("triton")
from isoexec.ops.logprobs import triton as logprobs_triton  # noqa: E402
from isoexec.ops.mla import triton as mla_triton  # noqa: E402
from isoexec.ops.moe import triton as moe_triton  # noqa: E402
from isoexec.ops.rms_norm import triton as rms_norm_triton  # noqa: E402

BOUNDARY = dict(input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32")
# The constants the H200 runs timed (benchmarks/RESULTS.md), by the shape each was timed at.
TIMED_NORMS = {128: (128, 1), 1024: (1024, 4), 2048: (2048, 8), 4096: (4096, 8)}
TIMED_VOCABS = {151936: (4096, 8)}
TIMED_EXPERTS = {(128, 768, 2048): dict(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)}
TIMED_ROUTERS = {(128, 2048): dict(block_t=16, block_k=128, num_warps=4), (256, 2048): dict(block_t=16, block_k=128, num_warps=4)}
TIMED_MLA = {(20, 192, 64, 512, 256): dict(block_m=64, block_n=32, block_k=64, gemm_block_m=64, gemm_block_n=128, gemm_num_warps=4,
                                           value_split=1, num_warps=8, num_stages=2)}


def test_the_timed_shapes_keep_their_constants():
    for width, (block, warps) in TIMED_NORMS.items():
        assert rms_norm_tuning.hopper_constants(width) == dict(reduce_block=block, num_warps=warps), width
    for vocab, (block, warps) in TIMED_VOCABS.items():
        assert logprobs_tuning.hopper_constants(vocab) == dict(vocab_block=block, num_warps=warps), vocab
    for shape, tile in TIMED_EXPERTS.items():
        assert moe_tuning.hopper_experts(*shape) == tile
    for shape, tile in TIMED_ROUTERS.items():
        assert moe_tuning.hopper_router(*shape) == tile
    assert moe_tuning.hopper_combine(2048) == dict(block_t=16, block_h=256, num_warps=4)
    for shape, tile in TIMED_MLA.items():
        assert mla_tuning.hopper_tile(*shape) == tile


@pytest.mark.parametrize("width", [16, 64, 128, 256, 768, 1000, 2560, 3584, 4096, 5120, 8192, 12288])
def test_every_row_width_gets_constants_rms_norm_accepts(width):
    constants = rms_norm_tuning.hopper_constants(width)
    rms_norm_triton.check_constants({**BOUNDARY, **constants})
    assert constants["reduce_block"] >= 64 and (width < 64 or width % constants["reduce_block"] == 0 or constants["reduce_block"] == 64)


@pytest.mark.parametrize("vocab", [64, 512, 1000, 32000, 151936, 248320])
def test_every_vocabulary_gets_constants_logprobs_accepts(vocab):
    logprobs_triton.check_constants({**BOUNDARY, "output_dtype": "float32", **logprobs_tuning.hopper_constants(vocab)})


@pytest.mark.parametrize("shape", [(6, 32, 64), (128, 768, 2048), (256, 512, 2048), (512, 512, 2048), (64, 1536, 2048), (160, 1536, 5120)])
def test_every_moe_layer_gets_tiles_the_kernels_accept(shape):
    experts, inter, hidden = shape
    for tile in (moe_tuning.hopper_experts(*shape), moe_tuning.hopper_router(experts, hidden), moe_tuning.hopper_combine(hidden)):
        moe_triton.check_constants({**BOUNDARY, **tile})
    assert moe_tuning.hopper_combine(hidden)["block_h"] <= max(16, hidden)


@pytest.mark.parametrize("shape", [(4, 16, 8, 32, 16), (20, 192, 64, 512, 256), (128, 128, 64, 512, 128), (16, 128, 64, 1024, 128)])
def test_every_mla_shape_gets_tiles_the_kernels_accept(shape):
    constants = {**BOUNDARY, "kv_cache_dtype": "bfloat16", "weight_dtype": "bfloat16", "split_kv_size": 0, **mla_tuning.hopper_tile(*shape)}
    mla_triton.check_constants(constants)
    mla_triton.check_geometry(constants, {"mla": {"kv_lora_rank": shape[3]}})


@pytest.mark.parametrize("preset, contract", [("qwen3.5-9b-4l-random", "tiny-hybrid-triton"),
                                              ("qwen3.5-35b-a3b-4l-random", "tiny-hybrid-triton"),
                                              ("qwen3-30b-a3b-4l-random", "tiny-moe-triton"),
                                              ("glm-4.7-flash-4l-random", "tiny-mla-triton")])
def test_fit_contract_gives_each_model_the_rules_constants(preset, contract):
    """A preset fitted on Hopper takes, in every entry whose impl has a rule, the rule's constants at the
    model's own shapes: its hidden size for the norms, its vocabulary for log-probs, its MoE layer, its MLA."""
    spec = PRESETS[preset]
    fitted = fit_contract(load_preset(contract), spec, arch="sm_90")
    expected = {"logprobs.triton": logprobs_tuning.hopper_constants(spec.vocab_size)}
    moe = [layer.ffn for layer in spec.layers if isinstance(layer.ffn, MoESpec)]
    if moe:
        expected["moe.experts.triton"] = moe_tuning.hopper_experts(moe[0].num_experts, moe[0].moe_intermediate_size, spec.hidden_size)
        expected["moe.router.triton"] = moe_tuning.hopper_router(moe[0].num_experts, spec.hidden_size)
        expected["moe.combine.triton"] = moe_tuning.hopper_combine(spec.hidden_size)
    if spec.mla:
        m = spec.mla[0]
        expected["mla.triton"] = mla_tuning.hopper_tile(m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim)
    seen = set()
    for entry in fitted.composition:
        if entry.impl.id in expected:
            assert {k: entry.constants[k] for k in expected[entry.impl.id]} == expected[entry.impl.id], (entry.impl.id, entry.region)
            seen.add(entry.impl.id)
        if entry.impl.id in ("rms_norm.triton", "rms_norm.residual.triton"):
            widths = [spec.norm_widths.get(op, spec.hidden_size) for op in entry.ops]
            tile = rms_norm_tuning.hopper_constants(max(widths))
            assert {k: entry.constants[k] for k in tile} == tile, entry.ops
            seen.add(entry.impl.id)
    assert set(expected) <= seen and seen & {"rms_norm.triton", "rms_norm.residual.triton"}, set(expected) - seen
