"""bench.py attention: the Triton attention and attention.native vs SDPA, on one set of heads (Qwen3-8B's).

prefill: one sequence of L tokens. SDPA gets contiguous q/k/v [1, H, L, D] with is_causal; the
         slot-addressed impls get the same values packed ([L, H, D], `packed_slot_table`).
decode:  B sequences with a context of L keys each, one query per sequence. SDPA gets q [B, H, 1, D]
         against contiguous K/V [B, Hkv, L, D] (enable_gqa); the slot-addressed impls read the same keys
         from a paged cache (pages of 16 slots in random order, `paged_slot_table`).
SDPA runs under the flash backend where torch offers it (else its default, recorded). Each impl's
`<impl>_vs_sdpa` is sdpa_ms / impl_ms (1.0: as fast as SDPA), and its max |output - SDPA's| is kept, so
a wrong kernel cannot pass as a fast one. Those times are eager launches, host included: a kernel shorter than
its Python launch (the Triton op's prefill of 512 tokens, ~30 us) waits on the host there, so on CUDA SDPA and the
Triton op are also timed as CUDA-graph replays (`sdpa_graph_ms`, `triton_graph_ms`, `triton_vs_sdpa_graph`): the
kernels alone. Achieved TFLOP/s counts the causal half (prefill); TB/s
counts the K and V bytes a decode step must read.
"""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from isoexec.ops.attention.metadata import packed_slot_table, paged_slot_table
from isoexec.runtime.registry import REGISTRY
from timing import graphed_ms, kernel_ms

PAGE_SIZE = 16


def slot_impls(device: torch.device, dtype: torch.dtype, with_reference: bool) -> dict:
    """name -> fn(q, k_store, v_store, slot_table, seq_ids, positions, scale), the impls available here."""
    name = str(dtype).removeprefix("torch.")
    boundary = dict(input_dtype=name, output_dtype=name, kv_cache_dtype=name)
    impls = {}
    if device.type != "cuda":
        print("attention.triton: skipped (no CUDA device; the interpreter is far too slow to time)")
    else:
        try:
            from isoexec.ops.attention import triton as attention_triton

            impls["triton"] = attention_triton.bench_op()
        except (ImportError, AttributeError) as error:
            print(f"attention.triton: skipped ({error})")
    impls["native"] = REGISTRY.get("attention.native", 1).bind(boundary)
    if with_reference:
        impls["reference"] = REGISTRY.get("attention.reference", 1).bind({
            **boundary, "accum_dtype": "float32", "block_n": 16, "reduce_block": 16, "block_tree": "balanced_binary", "split_kv_size": 0})
    return impls


def _randn(generator, *shape, dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, device=generator.device).to(dtype)


def _time_sdpa(q, k, v, device, **kwargs) -> tuple[float, float, str, torch.Tensor]:
    """(ms, ms as a graph replay (NaN off CUDA), backend, output) of SDPA on [B, H, Lq, D] tensors: flash, or torch's
    default where flash refuses."""
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)  # noqa: E731
    graph = (lambda fn: graphed_ms(fn, device)) if device.type == "cuda" else (lambda fn: float("nan"))
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return kernel_ms(sdpa, device), graph(sdpa), "flash", sdpa()
    except RuntimeError as error:
        print(f"SDPA flash backend unavailable for {tuple(q.shape)}: {str(error).splitlines()[0]}")
    return kernel_ms(sdpa, device), graph(sdpa), "default", sdpa()


def _measure(row: dict, impls: dict, args: tuple, expected: torch.Tensor, device, work: float, unit: str) -> dict:
    """Time every impl on the slot-addressed args; work / ms gives the rate in `unit` (x 1e-9 per ms)."""
    for name, op in impls.items():
        try:
            out = op(*args)
            row[f"{name}_max_abs_diff"] = float((out.float() - expected.float()).abs().max())
            row[f"{name}_ms"] = kernel_ms(lambda op=op: op(*args), device)
            if name == "triton":  # the one graph-capturable impl timed here (native's prefill syncs with the host)
                row["triton_graph_ms"] = graphed_ms(lambda op=op: op(*args), device)
                row["triton_vs_sdpa_graph"] = row["sdpa_graph_ms"] / row["triton_graph_ms"]
        except Exception as error:  # noqa: BLE001  (a kernel failing on one shape must not hide the other rows)
            row[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            print(f"attention {name} {row['form']} keys {row['keys']}: failed ({row[f'{name}_error']})")
    for key in [k for k in row if k.endswith("_ms") and not k.endswith("_graph_ms")]:
        impl = key.removesuffix("_ms")
        row[f"{impl}_{unit}"] = work / row[key] / 1e9
        if impl != "sdpa":
            row[f"{impl}_vs_sdpa"] = row["sdpa_ms"] / row[key]
    return row


def _print(row: dict, unit: str) -> None:
    impls = [k.removesuffix("_ms") for k in row if k.endswith("_ms") and not k.endswith("_graph_ms")]
    label = {"tflops": "TFLOP/s", "tbps": "TB/s"}[unit]
    timings = "  ".join(f"{i} {row[f'{i}_ms']:.3f} ms ({row[f'{i}_{unit}']:.1f} {label})" for i in impls)
    ratios = "  ".join(f"{i}/sdpa {row[f'{i}_vs_sdpa']:.2f}" for i in impls if i != "sdpa")
    graphs = f"  graphs: sdpa {row['sdpa_graph_ms']:.3f} ms triton {row['triton_graph_ms']:.3f} ms ({row['triton_vs_sdpa_graph']:.2f})" if "triton_graph_ms" in row else ""
    print(f"attention {row['form']:<7} batch {row['batch']:<3} keys {row['keys']:<5} {timings}  speed: {ratios}{graphs}", flush=True)


def prefill(impls, length, heads, device, dtype, generator) -> dict:
    num_heads, num_kv_heads, head_dim = heads
    scale = head_dim**-0.5
    q = _randn(generator, length, num_heads, head_dim, dtype=dtype)  # [L, H, D]
    k, v = (_randn(generator, length, num_kv_heads, head_dim, dtype=dtype) for _ in range(2))
    dense = [t.transpose(0, 1)[None].contiguous() for t in (q, k, v)]  # [1, H or Hkv, L, D]
    sdpa_ms, sdpa_graph_ms, backend, expected = _time_sdpa(*dense, device, is_causal=True, scale=scale)
    slot_table, seq_ids, positions = packed_slot_table(torch.tensor([0, length], device=device))
    row = {"form": "prefill", "batch": 1, "keys": length, "sdpa_backend": backend, "sdpa_ms": sdpa_ms, "sdpa_graph_ms": sdpa_graph_ms}
    flops = 4 * num_heads * head_dim * length * (length + 1) / 2  # QKᵀ and PV over the causal half
    return _measure(row, impls, (q, k, v, slot_table, seq_ids, positions, scale), expected[0].transpose(0, 1), device, flops, "tflops")


def decode(impls, batch, context, heads, device, dtype, generator) -> dict:
    num_heads, num_kv_heads, head_dim = heads
    scale = head_dim**-0.5
    q = _randn(generator, batch, num_heads, head_dim, dtype=dtype)  # [B, H, D]
    k, v = (_randn(generator, batch, num_kv_heads, context, head_dim, dtype=dtype) for _ in range(2))  # [B, Hkv, L, D]
    sdpa_ms, sdpa_graph_ms, backend, expected = _time_sdpa(q[:, :, None], k, v, device, scale=scale)
    pages_per_seq = -(-context // PAGE_SIZE)
    block_table = torch.randperm(batch * pages_per_seq, generator=generator, device=device).view(batch, pages_per_seq)
    slot_table = paged_slot_table(block_table, PAGE_SIZE, context)  # [B, L]
    k_store = torch.full((batch * pages_per_seq * PAGE_SIZE, num_kv_heads, head_dim), float("nan"), device=device, dtype=dtype)
    v_store = k_store.clone()
    k_store[slot_table.flatten()] = k.transpose(1, 2).reshape(-1, num_kv_heads, head_dim)
    v_store[slot_table.flatten()] = v.transpose(1, 2).reshape(-1, num_kv_heads, head_dim)
    seq_ids = torch.arange(batch, device=device)
    positions = torch.full((batch,), context - 1, device=device)
    row = {"form": "decode", "batch": batch, "keys": context, "sdpa_backend": backend, "sdpa_ms": sdpa_ms, "sdpa_graph_ms": sdpa_graph_ms}
    kv_bytes = 2 * batch * context * num_kv_heads * head_dim * k.element_size()
    return _measure(row, impls, (q, k_store, v_store, slot_table, seq_ids, positions, scale), expected[:, :, 0], device, kv_bytes, "tbps")


def bench_attention(sizes, device: torch.device) -> list[dict]:
    dtype = torch.bfloat16
    impls = slot_impls(device, dtype, with_reference=sizes.attention_reference)
    generator = torch.Generator(device).manual_seed(0)  # inputs drawn where they are used: 2 GiB of keys at decode 8192
    rows = []
    for length in sizes.prefill_lengths:
        rows.append(prefill(impls, length, sizes.attention_heads, device, dtype, generator))
        _print(rows[-1], "tflops")
    for batch in sizes.decode_batches:
        for context in sizes.decode_contexts:
            rows.append(decode(impls, batch, context, sizes.attention_heads, device, dtype, generator))
            _print(rows[-1], "tbps")
    return rows
