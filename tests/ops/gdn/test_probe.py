"""The admission battery on gdn.conv and gdn.core: the references admitted in every case in both dtype
passes, every expected row finite; the native pairs of forms rejected in engine_decode, where their decode
form is other arithmetic; the probes at a fitted model's widths."""

import functools

import torch

from conftest import preset_dict
from isoexec.contract import Contract
from isoexec.runtime.registry import REGISTRY, Impl, Registry
from isoexec.validate.battery import validate_entry

CASES = ["trainer_fwd", "trainer_score", "engine_prefill", "engine_decode"]
DTYPES = ("bfloat16", "float32")
CHUNK_SIZE = 64  # the default of a contract: lengths 1, 63, 64, 65, 133 and 5
CORE_REFERENCE = dict(input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32", chunk_size=CHUNK_SIZE, reduce_block=8,
                      block_tree="balanced_binary", tree="sequential")
CORE_NATIVE = dict(input_dtype="bfloat16", output_dtype="bfloat16", chunk_size=CHUNK_SIZE)
CONV = dict(input_dtype="bfloat16", output_dtype="bfloat16", weight_dtype="bfloat16", accum_dtype="float32")


def gdn_contract(region, impl, constants) -> Contract:
    """tiny-dense with a `region` entry pinning `impl` in every case (discharged against trainer_fwd)."""
    data = preset_dict("tiny-dense")
    data["composition"].append({"region": region, "ops": [region.replace(".", "_")], "cases": CASES, "impl": {"id": impl, "version": 1},
                                "constants": constants, "discharge": {"method": "bitwise_equal_to", "case": "trainer_fwd"}})
    return Contract.from_dict(data)


def battery(region, impl, constants, registry=REGISTRY, **kwargs):
    """validate_entry over the region's registered probe -> (result, {(dtype, case): trials}, trials whose expected rows are not all finite)."""
    seen, non_finite = {}, []

    def recording(ctx):
        for trial in REGISTRY.probe(region)(ctx):
            key = (str(ctx.dtype).removeprefix("torch."), trial.what.split(",")[0])
            seen[key] = seen.get(key, 0) + 1
            if not torch.isfinite(trial.expected.float()).all():
                non_finite.append(trial.what)
            yield trial

    contract = gdn_contract(region, impl, constants)
    result = validate_entry(contract, contract.entry(region, "trainer_fwd"), recording, registry=registry, device=torch.device("cpu"),
                            **kwargs)
    return result, seen, non_finite


def test_core_reference_is_admitted_in_every_case_and_dtype_pass():
    result, seen, non_finite = battery("gdn.core", "gdn.core.reference", CORE_REFERENCE)
    assert result.status == "admitted", result.failures[:5]
    assert result.dtypes == DTYPES and result.trials > 200
    assert {key for key in seen} == {(dtype, case) for dtype in DTYPES for case in CASES}
    assert not non_finite, non_finite[:3]


def test_core_native_is_rejected_in_engine_decode():
    """The control: native decodes by the recurrent step from a running state, the trainer's rows come
    from the chunk form (the UT system solved per chunk): different op sequences, so decoded rows differ."""
    result, _, _ = battery("gdn.core", "gdn.core.native", CORE_NATIVE)
    assert result.status == "rejected"
    assert not any("raised" in failure for failure in result.failures), result.failures[:5]
    for dtype in DTYPES:
        assert any(failure.startswith(f"{dtype}: engine_decode, decode") for failure in result.failures), dtype


def test_conv_reference_passes_every_row_trial_in_every_case_and_dtype_pass():
    result, seen, non_finite = battery("gdn.conv", "gdn.conv.reference", CONV)
    assert {key for key in seen} == {(dtype, case) for dtype in DTYPES for case in CASES}
    assert not non_finite, non_finite[:3]
    assert not [failure for failure in result.failures if "raised" not in failure], result.failures[:5]
    assert result.dtypes == DTYPES and result.trials > 200


def test_conv_reference_is_admitted():
    result, _, _ = battery("gdn.conv", "gdn.conv.reference", CONV)
    assert result.status == "admitted", result.failures[:5]


def test_conv_native_is_rejected_in_engine_decode():
    """The control: native decodes a single token by multiplying its window by the weight in bf16, each
    product rounded, and summing; a run of tokens goes through F.conv1d. Decoded rows differ."""
    result, _, _ = battery("gdn.conv", "gdn.conv.native", CONV)
    assert result.status == "rejected"
    assert any(failure.startswith("bfloat16: engine_decode, decode") for failure in result.failures), result.failures[:5]


def test_probes_run_at_a_fitted_models_widths():
    """`ctx.geometry["gdn"]` replaces the probes' own widths; the core's chunk size is the contract's
    (at 8 the default lengths include the 3C + 2 one)."""
    geometry = {"gdn": dict(num_k_heads=1, num_v_heads=3, k_head_dim=12, v_head_dim=5, conv_dim=20, conv_kernel=3)}
    widths, core_lengths = {"gdn.core": set(), "gdn.conv": set()}, set()

    def recording(region, fn, *args, **kwargs):
        if region == "gdn.core":
            q, k, v, state, rows = args[0], args[1], args[2], args[7], args[8]
            widths[region].add((q.shape[1:], k.shape[1:], v.shape[1:], None if state is None else (state.shape[1:], rows.shape[1:])))
            core_lengths.add(q.shape[0])
        else:
            x, weight, conv_state = args[:3]
            widths[region].add((x.shape[1:], weight.shape, None if conv_state is None else conv_state.shape[1:]))
        return fn(*args, **kwargs)

    registry = Registry()
    for region in widths:
        impl = REGISTRY.get(f"{region}.reference", 1)
        registry.register(Impl(id=impl.id, version=1, region=region, cases=impl.cases, fn=functools.partial(recording, region, impl.fn)))
    core = dict(CORE_REFERENCE, chunk_size=8)
    result, _, _ = battery("gdn.core", "gdn.core.reference", core, registry=registry, dtypes=("bfloat16",), geometry=geometry)
    assert result.status == "admitted", result.failures[:5]
    assert widths["gdn.core"] == {((1, 12), (1, 12), (3, 5), None), ((1, 12), (1, 12), (3, 5), ((3, 12, 5), (8, 3, 2 * 12 + 2 * 5 + 1)))}
    assert 3 * 8 + 2 in core_lengths
    result, _, _ = battery("gdn.conv", "gdn.conv.reference", CONV, registry=registry, dtypes=("bfloat16",), geometry=geometry)
    assert not [failure for failure in result.failures if "raised" not in failure], result.failures[:5]
    assert widths["gdn.conv"] == {((20,), (20, 3), None), ((20,), (20, 3), (2, 20))}
