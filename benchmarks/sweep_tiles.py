"""Tile sweeps: how the constants of the Triton kernels move their speed, every candidate's output compared
bit for bit with the listed constants' (the `attention`, `gemm`, `decode-launch`, `moe-tiles`, `mla-tiles` and
`gdn-tiles` sections of profile_gpu.py, whose docstring says what each measures). An experiment script
(docs/experiments.md), not a benchmark of record.
"""

import torch

from isoexec.model import PRESETS
from timing import graphed_ms, kernel_ms


def sweep_attention() -> None:
    """attention.triton's tile constants (block_m, num_warps, num_stages) per form, timed as graph replays
    beside flash SDPA; each output is compared bit for bit with the listed constants' (tile constants
    must not move a bit; block_n does, so it stays at the preset's 32)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from isoexec.ops.attention import paged_slot_table, packed_slot_table
    from isoexec.ops.attention import triton as attention_triton

    device, dim = torch.device("cuda"), 128
    randn = lambda *shape: torch.randn(*shape, device=device, dtype=torch.bfloat16)  # noqa: E731

    def packed(num_seqs, length, heads, kv_heads):
        table, seq_ids, positions = packed_slot_table(torch.arange(num_seqs + 1, device=device) * length)
        q, k, v = randn(num_seqs * length, heads, dim), randn(num_seqs * length, kv_heads, dim), randn(num_seqs * length, kv_heads, dim)
        dense = [t.view(num_seqs, length, -1, dim).transpose(1, 2).repeat_interleave(heads // t.shape[1], 1) for t in (q, k, v)]
        return (q, k, v, table, seq_ids, positions, dim**-0.5), lambda: F.scaled_dot_product_attention(*dense, is_causal=True)

    def decode(batch, keys, heads, kv_heads):
        pages = torch.randperm(batch * keys // 16, device=device).reshape(batch, keys // 16)
        k_store, v_store = randn(batch * keys, kv_heads, dim), randn(batch * keys, kv_heads, dim)
        q, seq_ids, positions = randn(batch, heads, dim), torch.arange(batch, device=device), torch.full((batch,), keys - 1, device=device)
        dense = [q[:, :, None], *(s[paged_slot_table(pages, 16, keys)].transpose(1, 2).repeat_interleave(heads // kv_heads, 1) for s in (k_store, v_store))]
        return (q, k_store, v_store, paged_slot_table(pages, 16, keys), seq_ids, positions, dim**-0.5), lambda: F.scaled_dot_product_attention(*dense)

    forms = [("prefill 1 x 2048, Qwen3-8B heads", False, packed(1, 2048, 32, 8)),
             ("training 8 x 2048, Qwen3-0.6B heads", False, packed(8, 2048, 16, 8)),
             ("training 32 x 512, Qwen3-0.6B heads", False, packed(32, 512, 16, 8)),
             ("decode 64 x 2048, Qwen3-8B heads", True, decode(64, 2048, 32, 8)),
             ("decode 64 x 2048, Qwen3-0.6B heads", True, decode(64, 2048, 16, 8))]
    for title, is_decode, (args, sdpa) in forms:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash = graphed_ms(sdpa, device)
        listed = attention_triton.bench_op()(*args)
        print(f"== attention.triton, {title}: flash SDPA {flash:.3f} ms; listed constants {attention_triton.HOPPER_CONSTANTS}")
        grid = [(m, w, st) for m in (64, 128) for w in (4, 8) for st in (1, 3)]
        if not is_decode:
            for block_n in (64, 128):  # re-blocks the softmax (bits differ): what a larger key block would buy
                op = attention_triton.bench_op(block_n=block_n)
                print(f"block_n {block_n} (listed tile): {graphed_ms(lambda op=op: op(*args), device):.3f} ms", flush=True)
        for block_m, num_warps, num_stages in grid:
            op = attention_triton.bench_op(block_m=block_m, num_warps=num_warps, num_stages=num_stages)
            try:
                same = torch.equal(op(*args).view(torch.int16), listed.view(torch.int16))
                ms = graphed_ms(lambda op=op: op(*args), device)
            except Exception as error:  # out of resources for some tiles
                print(f"block_m {block_m:>3} warps {num_warps} stages {num_stages}: {type(error).__name__}: {str(error).splitlines()[0][:80]}")
                continue
            print(f"block_m {block_m:>3} warps {num_warps} stages {num_stages}: {ms:.3f} ms ({flash / ms:.2f} of flash)  bits {'equal' if same else 'DIFFER'}",
                  flush=True)


# block_k is the listed one or twice it: whether a tile with another block_k keeps the bits is measured, not assumed.
DECODE_TILES = [dict(block_m=m, block_n=n, num_warps=w, num_stages=st, k_factor=kf) for m in (16, 32, 64) for n in (32, 64, 128)
                for w in (4, 8) for st in (3, 4) for kf in (1, 2) if w == 4 or m == 64]


def sweep_decode_gemm(model_name: str = "qwen3-0.6b-random") -> None:
    """Decode-sized GEMMs (M = 1 … 64) of `model_name`'s projections, each call a CUDA-graph replay as in the engine's
    decode (and the joined qkv and gate_up launches): linear.triton with the decode tile
    (`tuning.hopper_decode_tile`: the launch's own; an entry's is `hopper_decode_fit` over all its launches) against candidate tiles with the listed block_k or twice it, and cuBLAS. Each candidate's output is
    compared bit for bit with the listed tile's: a tile that keeps the bits could be pinned for
    engine_decode alone (the battery then proves it). One tile serves every decode batch, so candidates
    are ranked by their time summed over M. The swapped launch, which bf16 calls of up to 16 rows take
    whatever the tile (`ops/linear/swapped_triton.py`; `sweep_decode_swap.py` sweeps it), is kept off so
    every candidate runs its own tile."""
    from isoexec.ops.linear import triton as linear_triton, tuning
    from sweep_decode_swap import without_swap

    with without_swap():
        _sweep_decode_gemm(linear_triton, tuning, model_name)


def _sweep_decode_gemm(linear_triton, tuning, model_name: str) -> None:
    device = torch.device("cuda")
    ms_of = lambda fn: graphed_ms(fn, device)  # noqa: E731  (decode runs as CUDA graphs: device time, no host launch cost)
    print(f"== decode GEMM tiles, {model_name}'s shapes, bf16: ms of a CUDA-graph replay at M = 1, 16, 64 and their sum "
          "(* = bits differ from the listed tile)")
    shapes = {}
    for op, sizes in PRESETS[model_name].projections.items():
        for n, k in sizes:
            shapes.setdefault((n, k), op)
    projections = {op: next(iter(sizes)) for op, sizes in PRESETS[model_name].projections.items()}
    for joined, parts in (("qkv (joined)", ("q_proj", "k_proj", "v_proj")), ("gate_up (joined)", ("gate_proj", "up_proj"))):
        if all(part in projections for part in parts):  # the engine runs these as one launch (linear/joined.py)
            shapes.setdefault((sum(projections[part][0] for part in parts), projections[parts[0]][1]), joined)
    for (n, k), name in shapes.items():
        listed = dict(tuning.hopper_decode_tile(n, k) or linear_triton.hopper_constants(n, k))
        tiles = {key: listed[key] for key in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        xs = {m: torch.randn(m, k, device=device, dtype=torch.bfloat16) for m in (1, 16, 64)}
        wants = {m: linear_triton.linear_fwd(x, w, None, torch.bfloat16, **tiles) for m, x in xs.items()}
        cublas = [ms_of(lambda x=x: torch.nn.functional.linear(x, w)) for x in xs.values()]
        results = []
        for candidate in DECODE_TILES:
            config = {key: v for key, v in candidate.items() if key != "k_factor"}
            config["block_k"] = tiles["block_k"] * candidate["k_factor"]
            try:
                same = all(torch.equal(linear_triton.linear_fwd(x, w, None, torch.bfloat16, **config).view(torch.int16), wants[m].view(torch.int16))
                           for m, x in xs.items())
                times = [ms_of(lambda x=x: linear_triton.linear_fwd(x, w, None, torch.bfloat16, **config)) for x in xs.values()]
            except Exception as error:  # noqa: BLE001  (out of resources)
                print(f"  {name} {config}: {type(error).__name__}")
                continue
            results.append((sum(times), times, same, config))
        label = lambda c: f"{c['block_m']}x{c['block_n']}x{c['block_k']}/w{c['num_warps']}s{c['num_stages']}"  # noqa: E731
        print(f"{name:<9} N={n} K={k}  cuBLAS {' '.join(f'{t:.4f}' for t in cublas)} = {sum(cublas):.4f}  "
              f"({sum(not r[2] for r in results)}/{len(results)} candidates differ in bits)")
        for total, times, same, config in sorted(results, key=lambda r: r[0])[:6]:
            mark = " (listed)" if config == tiles else ""
            print(f"    {' '.join(f'{t:.4f}' for t in times)} = {total:.4f}{'' if same else '*'}  {label(config)}{mark}", flush=True)
        listed_row = next((r for r in results if r[3] == tiles), None)
        if listed_row:
            print(f"    listed {label(tiles)}: {' '.join(f'{t:.4f}' for t in listed_row[1])} = {listed_row[0]:.4f}")


def decode_launch(model_name: str, ms=(1, 16, 64), num_leaves=8) -> None:
    from isoexec.ops.linear import persistent_triton, row_parallel_triton, tuning
    from isoexec.ops.linear import triton as linear_triton

    device = torch.device("cuda")
    spec = PRESETS[model_name]
    print(f"== decode GEMMs of {model_name}: ms of a CUDA-graph replay at M = {', '.join(map(str, ms))}; "
          "GB/s = weight bytes / time at M = 1")
    for op, shapes in spec.projections.items():
        for n, k in shapes:
            tile = tuning.hopper_decode_tile(n, k)
            if tile is None:
                continue
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
            xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for m in ms]

            def persistent(x):
                y = x.new_empty((x.shape[0], n))
                persistent_triton.linear_fwd_persistent(x, w, None, y, **tile)
                return y

            def grid(x):
                y = x.new_empty((x.shape[0], n))
                linear_triton.launch(x, w, None, y[None], **tile)
                return y

            forms = {"cublas": lambda x: torch.nn.functional.linear(x, w), "persistent": persistent, "grid": grid}
            if op in ("o_proj", "down_proj"):
                forms["row_parallel"] = lambda x: row_parallel_triton.fused_fwd(x, w, None, torch.bfloat16, num_leaves=num_leaves, **tile)
            same = all(torch.equal(persistent(x).view(torch.int16), grid(x).view(torch.int16)) for x in xs)
            times = {name: [graphed_ms(lambda x=x, f=f: f(x), device) for x in xs] for name, f in forms.items()}
            print(f"{op:<10} N={n:<6} K={k:<5} launches {'agree' if same else 'DIFFER'}  " + "  ".join(
                f"{name} {' / '.join(f'{t:.4f}' for t in ts)} ({n * k * 2 / ts[0] / 1e6:.0f} GB/s)" for name, ts in times.items()), flush=True)


def profile_moe_tiles(tokens=(1, 16, 64, 4096), shapes=None, device="cuda") -> None:
    import itertools

    from moe import BOUNDARY, GPU_SHAPES, _params, contract_layer, grouped_mm_layer

    from isoexec.ops.moe import experts_triton, native, tuning
    from isoexec.ops.moe import triton as moe_triton

    device = torch.device(device)

    def timed(fn, count):
        return graphed_ms(fn, device) if count <= 64 else kernel_ms(fn, device)

    for shape in shapes or GPU_SHAPES:
        generator = torch.Generator(device=device).manual_seed(0)
        p = _params(shape, device, generator)
        e, h, i = shape["experts"], shape["hidden"], shape["inter"]
        listed_e, listed_r, listed_c = tuning.hopper_experts(e, i, h), tuning.hopper_router(e, h), tuning.hopper_combine(h)
        xs = {t: torch.randn(t, h, generator=generator, device=device).bfloat16() for t in tokens}
        print(f"== MoE shape E={e} I={i} H={h} top-{p.top_k}: ms per call (graph replays at <= 64 tokens)", flush=True)

        def route(x, tile):
            return moe_triton.router(x, p.gate, None, p.top_k, **BOUNDARY, **tile)

        def run_experts(x, ids, tile):
            return experts_triton.experts(x, ids, p.gate_up, p.down, **BOUNDARY, output_dtype="bfloat16", compute_dtype="float32", **tile)

        with torch.no_grad():
            for t, x in xs.items():
                weights, ids = route(x, listed_r)
                routed = run_experts(x, ids, listed_e)
                pieces = {
                    "router": lambda: route(x, listed_r),
                    "experts": lambda: run_experts(x, ids, listed_e),
                    "combine": lambda: moe_triton.combine(routed, weights, ids, input_dtype="bfloat16", output_dtype="bfloat16",
                                                          accum_dtype="float32", **listed_c),
                    "layer": lambda: contract_layer(shape)(x, p),
                    "native router": lambda: native.router(x, p.gate, None, p.top_k, **BOUNDARY),
                    "grouped_mm experts": lambda: native.experts_grouped_mm(x, ids, p.gate_up, p.down, **BOUNDARY, output_dtype="bfloat16",
                                                                            compute_dtype="bfloat16"),
                    "grouped_mm layer": lambda: grouped_mm_layer(x, p),
                }
                print(f"  T={t:>5}  " + "  ".join(f"{name} {timed(fn, t):.4f}" for name, fn in pieces.items()), flush=True)

            print(f"  router tiles (listed {listed_r}):", flush=True)
            for block_t, block_k, warps in itertools.product((16, 32, 64), (64, 128), (4, 8)):
                tile = dict(block_t=block_t, block_k=block_k, num_warps=warps)
                try:
                    times = [timed(lambda: route(x, tile), t) for t, x in xs.items()]
                    same = all(torch.equal(route(x, tile)[0].view(torch.int32), route(x, listed_r)[0].view(torch.int32)) for x in xs.values())
                except Exception as error:  # a tile the device cannot hold
                    print(f"    {tile}: {type(error).__name__}", flush=True)
                    continue
                print(f"    {' '.join(f'{v:.4f}' for v in times)}{'' if same else ' (other bits)'}  {tile}", flush=True)

            print(f"  experts tiles (listed {listed_e}):", flush=True)
            routing = {t: route(x, listed_r)[1] for t, x in xs.items()}
            want = {t: run_experts(x, routing[t], listed_e) for t, x in xs.items()}
            for block_m, block_n, block_k, stages in itertools.product((16, 32, 64), (64, 128), (64, 128), (3, 4)):
                tile = dict(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=4, num_stages=stages)
                try:
                    times = [timed(lambda: run_experts(x, routing[t], tile), t) for t, x in xs.items()]
                    same = all(torch.equal(run_experts(x, routing[t], tile).view(torch.int16), want[t].view(torch.int16)) for t, x in xs.items())
                except Exception as error:
                    print(f"    {tile}: {type(error).__name__}", flush=True)
                    continue
                print(f"    {' '.join(f'{v:.4f}' for v in times)}{'' if same else ' (other bits)'}  {tile}", flush=True)
        p = xs = None  # the shape's weights and inputs freed before the next shape's are drawn
        if device.type == "cuda":
            torch.cuda.empty_cache()


def profile_mla_tiles(model="glm-4.7-flash-4l-random", device="cuda", sizes=((8, 2048), (2048, 8192), 2048)) -> None:
    from mla import _inputs, _paged

    from isoexec.ops.attention.metadata import packed_slot_table
    from isoexec.ops.mla import triton as mla_triton
    from isoexec.ops.mla import tuning
    from isoexec.runtime.registry import REGISTRY

    device = torch.device(device)
    spec = PRESETS[model]
    m = spec.mla[0]
    (seqs, seq_len), (chunk, cached), context = sizes
    listed = tuning.hopper_tile(m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank, m.v_head_dim)
    generator = torch.Generator(device=device).manual_seed(0)
    cases = {}
    cu = torch.arange(seqs + 1, device=device) * seq_len
    cases[f"train {seqs}x{seq_len}"] = (_inputs(spec, seqs * seq_len, seqs * seq_len, device, generator), *packed_slot_table(cu), False)
    table, seq_ids, positions, slots = _paged(1, cached, chunk, device, generator)
    cases[f"prefill {chunk}@{cached}"] = (_inputs(spec, chunk, slots, device, generator), table, seq_ids, positions, False)
    for batch in (1, 16, 64):
        table, seq_ids, positions, slots = _paged(batch, context, 1, device, generator)
        cases[f"decode b{batch}@{context}"] = (_inputs(spec, batch, slots, device, generator), table, seq_ids, positions, True)
    boundary = dict(input_dtype="bfloat16", output_dtype="bfloat16", kv_cache_dtype="bfloat16", weight_dtype="bfloat16",
                    accum_dtype="float32", split_kv_size=0)

    def whole(tile):
        op = REGISTRY.get("mla.triton", 1).bind({**boundary, **listed, **tile})
        return lambda x, t, s, p: op(x["q_nope"], x["q_rope"], x["rows"], x["kv_b"], t, s, p, x["scale"])

    def latent(tile):
        keys = ("block_m", "block_n", "value_split", "num_warps", "num_stages")
        merged = {**listed, **tile}
        return lambda x, t, s, p: mla_triton.mla_attn_latent(x["q_lat"], x["q_rope"], x["rows"], t, s, p, x["scale"],
                                                             **{k: merged[k] for k in keys})

    for x, *_ in cases.values():
        x["q_lat"] = torch.randn(*x["q_nope"].shape[:2], m.kv_lora_rank, generator=generator, device=device).bfloat16()
    timed = lambda fn, graph: graphed_ms(fn, device) if graph and device.type == "cuda" else kernel_ms(fn, device)
    print(f"== mla.triton at {model}'s MLA shape, ms per call; listed {listed}", flush=True)
    print("   " + "  ".join(cases), flush=True)
    tiles = [dict()] + [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=st, value_split=vs) for bm, bn, w, st, vs in (
        (64, 32, 8, 1, 1), (64, 32, 8, 3, 1), (64, 64, 8, 2, 1), (64, 32, 4, 2, 1), (64, 16, 8, 2, 1), (128, 32, 8, 2, 1),
        (128, 64, 8, 2, 1), (64, 32, 8, 2, 2), (64, 32, 8, 2, 4), (64, 64, 8, 2, 2), (64, 32, 4, 2, 2))]
    with torch.no_grad():
        want = {name: whole({})(x, t, s, p) for name, (x, t, s, p, _) in cases.items()}
        for tile in tiles:
            for label, make in (("attention", latent), ("whole op", whole)):
                try:
                    fn = make(tile)
                    times = [timed(lambda: fn(x, t, s, p), graph) for x, t, s, p, graph in cases.values()]
                    same = all(torch.equal(whole(tile)(x, t, s, p).view(torch.int16), want[name].view(torch.int16))
                               for name, (x, t, s, p, _) in cases.items()) if label == "whole op" else True
                except Exception as error:  # a tile the device cannot hold
                    print(f"    {tile or 'listed'} {label}: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True)
                    continue
                print(f"    {' '.join(f'{v:8.4f}' for v in times)}  {label:<9}{'' if same else ' (other bits)'}  {tile or 'listed'}",
                      flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


def profile_gdn_tiles(device="cuda", configs=None, with_fla=True, shapes=None) -> None:
    from gdn import SHAPES, _fla, _fla_chunk, _fla_decode, _inputs

    from isoexec.ops.gdn import triton as gdn_triton
    from isoexec.runtime.registry import REGISTRY

    TOKEN_INPUTS = ("q", "k", "v", "a", "b")
    device = torch.device(device)
    configs = configs or [dict(chunk_size=c, block_v=bv, num_warps=w, dot_precision=p) for c, bv, w, p in (
        (32, 128, 8, "bf16"), (32, 64, 4, "bf16"), (16, 128, 8, "bf16"), (16, 128, 4, "bf16"), (16, 64, 4, "bf16"), (64, 128, 8, "bf16"),
        (64, 64, 8, "bf16"), (32, 128, 8, "tf32"))]
    fla, why = _fla() if with_fla else (None, "not asked for")
    generator = torch.Generator(device=device).manual_seed(0)
    for shape_name, shape in SHAPES.items():
        if shapes and shape_name not in shapes:
            continue
        hk, hv, dk, dv = shape
        print(f"== gdn.core.triton at {shape_name} (ms per call; FLA: {'flash-linear-attention' if fla else why})", flush=True)
        train = _inputs(shape, 8 * 2048, device, generator)
        train_pos = torch.arange(2048, device=device).repeat(8)
        prefill = _inputs(shape, 2048, device, generator)
        decode = _inputs(shape, 256, device, generator)
        if fla is not None:
            cu = torch.arange(9, device=device) * 2048
            state = torch.randn(256, hv, dk, dv, generator=generator, device=device) * 0.05
            with torch.no_grad():
                fla_times = [kernel_ms(lambda: _fla_chunk(fla, train, cu), device),
                             kernel_ms(lambda: _fla_chunk(fla, prefill, torch.tensor([0, 2048], device=device), state[:1].clone()), device)]
                for batch in (1, 16, 64, 256):
                    x = {k: (t[:batch] if k in TOKEN_INPUTS else t) for k, t in decode.items()}
                    s = state[:batch].clone()
                    fla_times.append(graphed_ms(lambda: _fla_decode(fla, x, s), device))
            print("    fla      " + " ".join(f"{t:8.4f}" for t in fla_times) + "   (train, prefill, decode b1 b16 b64 b256)", flush=True)
        for config in configs:
            constants = dict(input_dtype="bfloat16", output_dtype="bfloat16", accum_dtype="float32", **config)
            op = REGISTRY.get("gdn.core.triton", gdn_triton.VERSION).bind(constants)
            chunk = config["chunk_size"]
            width = gdn_triton.row_width(hv, dk, dv, config)

            def cache(n):
                return (torch.full((n, hv, dk, dv), float("nan"), device=device),
                        torch.full((n, chunk, hv, width), float("nan"), device=device))

            def rows_of(x, start, stop):
                return {k: (t[start:stop] if k in TOKEN_INPUTS else t) for k, t in x.items()}

            def call(x, positions, state=None, rows=None, ids=None):
                return op(x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"], state, rows, ids, positions)

            try:
                with torch.no_grad():
                    # Bits: one sequence of 2C + 37 tokens in every form.
                    n = 2 * chunk + 37
                    seq, other = rows_of(prefill, 0, n), rows_of(prefill, n, n + 50)
                    alone = call(seq, torch.arange(n, device=device))
                    both = {k: torch.cat([other[k], seq[k]]) if k in TOKEN_INPUTS else seq[k] for k in seq}
                    forms = {"packed after another": call(both, torch.cat([torch.arange(50), torch.arange(n)]).to(device))[50:]}
                    for label, cuts in (("prefill chunks of 37", list(range(0, n, 37))), ("decode", list(range(n)))):
                        state, rows = cache(3)
                        pieces = [call(rows_of(seq, start, stop), torch.arange(start, stop, device=device), state, rows,
                                       torch.full((stop - start,), 1, device=device)) for start, stop in zip(cuts, [*cuts[1:], n])]
                        forms[label] = torch.cat(pieces)
                    bits = {label: int((out.view(torch.int16) != alone.view(torch.int16)).sum()) for label, out in forms.items()}
                    times = [kernel_ms(lambda: call(train, train_pos), device)]
                state, rows = cache(256)
                leaves = {k: (t.clone().requires_grad_() if k in TOKEN_INPUTS else t) for k, t in train.items()}
                grad = torch.randn(train["v"].shape, generator=generator, device=device).to(torch.bfloat16)

                def fwd_bwd():
                    call(leaves, train_pos).backward(grad)
                    for t in leaves.values():
                        t.grad = None

                times.append(kernel_ms(fwd_bwd, device))
                with torch.no_grad():
                    state.normal_(0, 0.05)
                    rows.normal_(0, 0.05)
                    times.append(kernel_ms(lambda: call(prefill, 2048 + torch.arange(2048, device=device), state[:1], rows[:1],
                                                        torch.zeros(2048, dtype=torch.long, device=device)), device))
                print("    " + " ".join(f"{t:8.4f}" for t in times) + f"   {config}  differing elements {bits}", flush=True)
                with torch.no_grad():
                    times = []
                    for batch in (1, 16, 64, 256):
                        x = rows_of(decode, 0, batch)
                        ids = torch.arange(batch, device=device)
                        for offset in (0, chunk - 1):
                            positions = torch.full((batch,), 2048 + offset, device=device)
                            times.append(graphed_ms(lambda: call(x, positions, state, rows, ids), device))
            except Exception as error:  # a config the device cannot hold
                print(f"    {config}: {type(error).__name__}: {str(error).splitlines()[0][:160]}", flush=True)
                continue
            print("    " + " ".join(f"{t:8.4f}" for t in times) + "   decode b1 @0 @C-1, b16, b64, b256", flush=True)
        print("    (columns: train 8x2048 forward, forward + backward, prefill 2048@2048)", flush=True)
        torch.cuda.empty_cache()
