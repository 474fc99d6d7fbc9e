"""`isoexec validate`: run the admission battery over a contract and record what it proves."""

import time

import torch

from ..contract.identity import identities
from ..contract.schema import Contract
from ..runtime.fingerprint import runtime_info
from ..runtime.registry import REGISTRY, Registry
from . import records
from .battery import EntryResult, validate_entry


def geometry_of(spec) -> dict:
    """The model shapes the probes run at (`Context.geometry`) and admission records are keyed by: the
    attention heads and head_dim (of its first `gqa` mixer), the projections' K values, and for a model
    with MoE layers their [experts, moe_intermediate_size, top_k] and the hidden size; for one with `mla`
    mixers the first one's heads and widths, with `gdn` mixers the first one's heads, widths and conv.
    Empty without a model."""
    from ..model.spec import MoESpec

    if spec is None:
        return {}
    geometry = {}
    if spec.attention:
        attention = spec.attention[0]
        geometry = {"num_heads": attention.num_heads, "num_kv_heads": attention.num_kv_heads, "head_dim": attention.head_dim}
    if spec.mla:
        mla = spec.mla[0]
        geometry["mla"] = {"num_heads": mla.num_heads, "qk_nope_head_dim": mla.qk_nope_head_dim, "qk_rope_head_dim": mla.qk_rope_head_dim,
                           "kv_lora_rank": mla.kv_lora_rank, "v_head_dim": mla.v_head_dim}
    if spec.gdn:
        gdn = spec.gdn[0]
        geometry["gdn"] = {"num_k_heads": gdn.num_k_heads, "num_v_heads": gdn.num_v_heads, "k_head_dim": gdn.k_head_dim,
                           "v_head_dim": gdn.v_head_dim, "conv_dim": gdn.conv_dim, "conv_kernel": gdn.conv_kernel}
    geometry["linear_k"] = sorted({k for shapes in spec.projections.values() for _, k in shapes})
    moe = sorted({(f.num_experts, f.moe_intermediate_size, f.top_k) for f in (layer.ffn for layer in spec.layers) if isinstance(f, MoESpec)})
    if moe:
        geometry |= {"moe": [list(shape) for shape in moe], "hidden_size": spec.hidden_size}
    return geometry


def validate(contract: Contract, *, device: str = "cpu", registry: Registry = REGISTRY, record: bool = True, progress=None,
             spec=None, regions=None) -> dict:
    """Validate every composition entry of `contract` (or only those of `regions`); returns the JSON report.

    `progress(entry_result)` is called after each entry; with `record`, admission records are written.
    `spec` (a ModelSpec), for a contract fitted to that model: probes that depend on the model's shapes
    (attention: head_dim and query heads per KV head; GEMMs: the projections' K) run at them, and the
    records are keyed by them (`geometry_of`), so they count only for a process running that model.
    """
    target = torch.device(device)
    runtime = runtime_info(target)
    start = time.perf_counter()
    geometry = geometry_of(spec)
    kernels = []
    for entry in contract.composition:
        if regions is not None and entry.region not in regions:
            continue
        impl = registry.get(entry.impl.id, entry.impl.version)
        probe = registry.probe(entry.region)
        if impl is None or probe is None:
            missing = f'impl "{entry.impl}" is not registered' if impl is None else f'no probe for region "{entry.region}"'
            result = EntryResult(entry.region, str(entry.impl), entry.cases, entry.constants, [missing], 0, 0.0, ())
        else:
            result = validate_entry(contract, entry, probe, registry=registry, device=target, geometry=geometry)
            if record:
                anchor = [entry.discharge.case] if entry.discharge.method == "bitwise_equal_to" else []
                records.write(impl, entry.constants, runtime, geometry=geometry, cases=list(entry.cases) + anchor, status=result.status,
                              dtypes=list(result.dtypes), trials=result.trials, failures=result.failures)
        kernels.append(result.to_dict())
        if progress is not None:
            progress(result)
    admitted = sum(k["status"] == "admitted" for k in kernels)
    return {
        "contract": {"name": contract.name, **identities(contract).to_dict()},
        "runtime": runtime,
        "geometry": geometry,
        "kernels": kernels,
        "admitted": admitted,
        "rejected": len(kernels) - admitted,
        "seconds": round(time.perf_counter() - start, 2),
    }
