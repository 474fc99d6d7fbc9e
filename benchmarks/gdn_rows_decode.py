"""A design probe for issue 19's decode goal: a decode step whose chunk inverse comes one row at a time, from the
rows before it kept in the slot, timed against gdn.core.triton@3's step and flash-linear-attention's recurrent step.

Why: a @3 decode step recomputes its open chunk through a chain of dependent 16-row products (the Gram matrix, the
inverse's D², D⁴, D⁸ and last update, W, W S₀, scores δ), latency-bound at batch 1-4 (1.97 / 1.67 / 1.47x FLA's step on
an H100). The inverse T = (I + A)^-1 by forward substitution, T_i = e_i - Σ_{j<i} A_ij T_j, gives row i from row i of A
and the rows before it. Done as an ieee `tl.dot` of A's row i against the earlier rows (one FMA chain per element in
ascending j, whatever the layout), a training chunk computes its rows in turn and a decode step computes only its own,
with the same bits, from T's earlier rows cached in the slot (16 floats a row and value head). The step's chain then
loses the inverse's four products for one FMA dot. Two forms of δ on top:
- `rows`: δ = U - W S₀ with W = T (β e^c k), U = T (β v), as @3 (the training walk unchanged);
- `rows+x`: δ = T (β (v - e^c ⊙ k S₀)), the same function: k S₀ runs beside the Gram matrix and the row solve, and
  W's product leaves the chain (the training walk would take one more product a chunk).

Both change the rows' bits against the product inverse (another inverse, another rounding). The first is what
gdn.core.triton computes with its constant `inverse = "rows"` (the slot keeps T's rows; ops/gdn/triton_tiles.py). This
script times, over a whole chunk of decode steps (16 from a chunk's first offset, one CUDA graph, as `bench.py gdn`
times "decode chunk"): the contract's op (`inverse = "products"`), the op with `inverse = "rows"`, FLA's recurrent step,
and a standalone kernel of each form (the slot's rows, its T rows and the state as the op's step reads them, without the
op's run finding: what the design costs at least). Every output is compared with FLA's from the same state. Three
ablations of the `rows` kernel, timed alone (their outputs are not GDN's), say where its step goes: the loads and
stores alone, then up to T's row, then up to δ.

    cd benchmarks && PYTHONPATH=../src:/tmp/site python3 gdn_rows_decode.py [--batches 1,2,4,8,16] [--shape hk16-hv32-d128]
    TRITON_INTERPRET=1 PYTHONPATH=../src python3 gdn_rows_decode.py --device cpu   # the kernel's logic, against gdn.core.reference
"""
import argparse
import math

import torch

from isoexec.ops import triton_support
from isoexec.ops.gdn.triton_tiles import L2_EPS, _gates, _mm, _operand
from isoexec.ops.triton_support import jit, tl

# form -> (δ's form, the last stage computed). The stages before the last (3) are ablations for timing alone: 0 the
# loads and stores, 1 with the norms, Gram matrix and row solve, 2 with W, U and δ; each stores what it computed last.
FORMS = {"rows": (0, 3), "rows+x": (1, 3)}
ABLATIONS = {"rows, loads and stores": (0, 0), "rows, to the row solve": (0, 1), "rows, to δ": (0, 2)}


@jit
def rows_step_kernel(q, k, v, a, b, a_log, dt_bias, out, state, rows_cache, t_cache, positions, q_scale,
                     HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                     FORM: tl.constexpr, STAGE: tl.constexpr, P: tl.constexpr, INTERPRET: tl.constexpr):
    """One decode token of sequence i_b, value head i_h, value columns [i_v BV, (i_v + 1) BV)."""
    NV: tl.constexpr = DV // BV
    width: tl.constexpr = DK + DV + 16
    i_b, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // (HV // HK)
    rows = tl.arange(0, C)
    o_k, o_v = tl.arange(0, DK), i_v * BV + tl.arange(0, BV)
    pos = tl.load(positions + i_b)
    off = pos % C
    cached, new = rows < off, rows == off
    p_rows = rows_cache + i_b.to(tl.int64) * (C * HV * width) + i_h * width + rows * (HV * width)  # [C]
    # The chunk's keys and gates: the slot's earlier rows, this token's, zeros after.
    k_new = tl.load(k + (i_b * HK + i_kh) * DK + o_k).to(tl.float32)
    kf = tl.where(new[:, None], k_new[None, :], tl.load(p_rows[:, None] + o_k[None, :], mask=cached[:, None], other=0.0))
    g_new, beta_new = _gates(tl.load(a + i_b * HV + i_h), tl.load(b + i_b * HV + i_h), -tl.exp(tl.load(a_log + i_h).to(tl.float32)),
                             tl.load(dt_bias + i_h).to(tl.float32))
    g = tl.where(new, g_new, tl.load(p_rows + DK + DV, mask=cached, other=0.0))
    beta = tl.where(new, beta_new, tl.load(p_rows + DK + DV + 1, mask=cached, other=0.0))
    kn = _operand(kf * (1.0 / tl.sqrt(tl.sum(kf * kf, 1) + L2_EPS))[:, None], P, INTERPRET)
    c = tl.cumsum(g, 0)
    below = rows[:, None] > rows[None, :]
    system = tl.where(below, beta[:, None] * _mm(kn, tl.trans(kn), P, INTERPRET) * tl.exp(tl.where(below, c[:, None] - c[None, :], 0.0)), 0.0)
    # T's row `off` from its earlier rows (the slot's): e_off - A_off T, one ieee FMA chain an element.
    p_t = t_cache + i_b.to(tl.int64) * (C * HV * C) + i_h * C + rows[:, None] * (HV * C) + rows[None, :]
    t_old = tl.load(p_t, mask=cached[:, None], other=0.0)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    if STAGE >= 1:
        t = tl.where(new[:, None], eye - tl.dot(tl.where(new[:, None], system, 0.0), t_old, input_precision="ieee"), t_old)
    else:
        t = t_old
    t_op = _operand(t, P, INTERPRET)
    v_new = tl.load(v + (i_b * HV + i_h) * DV + o_v).to(tl.float32)
    vf = tl.where(new[:, None], v_new[None, :], tl.load(p_rows[:, None] + DK + o_v[None, :], mask=cached[:, None], other=0.0))
    p_state = state + (i_b * HV + i_h).to(tl.int64) * (DK * DV) + o_k[:, None] * DV + o_v[None, :]
    s0 = tl.load(p_state)
    s_op = _operand(s0, P, INTERPRET)
    if STAGE < 2:
        delta = _operand(vf + tl.sum(s0, 0)[None, :] + tl.sum(kf, 1)[:, None] + tl.sum(t, 1)[:, None] + g[:, None] + beta[:, None], P,
                         INTERPRET)
    elif FORM == 0:
        w = _operand(_mm(t_op, _operand((beta * tl.exp(c))[:, None] * kn.to(tl.float32), P, INTERPRET), P, INTERPRET), P, INTERPRET)
        delta = _operand(_mm(t_op, _operand(beta[:, None] * vf, P, INTERPRET), P, INTERPRET) - _mm(w, s_op, P, INTERPRET), P, INTERPRET)
    else:
        x = beta[:, None] * (vf - tl.exp(c)[:, None] * _mm(kn, s_op, P, INTERPRET))
        delta = _operand(_mm(t_op, _operand(x, P, INTERPRET), P, INTERPRET), P, INTERPRET)
    q_new = tl.load(q + (i_b * HK + i_kh) * DK + o_k).to(tl.float32)
    qn = _operand(tl.where(new[:, None], q_new[None, :], 0.0) * (1.0 / tl.sqrt(tl.sum(q_new * q_new, 0) + L2_EPS)) * q_scale, P, INTERPRET)
    upto = rows[:, None] >= rows[None, :]
    scores = _operand(tl.where(upto, _mm(qn, tl.trans(kn), P, INTERPRET) * tl.exp(tl.where(upto, c[:, None] - c[None, :], 0.0)), 0.0),
                      P, INTERPRET)
    if STAGE == 3:
        o = tl.exp(c)[:, None] * _mm(qn, s_op, P, INTERPRET) + _mm(scores, delta, P, INTERPRET)
    else:
        o = delta.to(tl.float32) + tl.sum(q_new, 0)
    tl.store(out + (i_b * HV + i_h) * DV + o_v[None, :] + 0 * rows[:, None], o.to(out.dtype.element_ty), mask=new[:, None])
    # This token's row into the slot (k, g, β and T's row from the last block; no program reads the row it writes).
    tl.store(p_rows[:, None] + DK + o_v[None, :], vf, mask=new[:, None])
    if i_v == NV - 1:
        tl.store(p_rows[:, None] + o_k[None, :], kf, mask=new[:, None])
        tl.store(p_rows + DK + DV, g, mask=new)
        tl.store(p_rows + DK + DV + 1, beta, mask=new)
        tl.store(p_t, t, mask=new[:, None])
    if off == C - 1:
        c_last = tl.sum(tl.where(rows == C - 1, c, 0.0), 0)
        decayed = _operand(kn.to(tl.float32) * tl.exp(c_last - c)[:, None], P, INTERPRET)
        tl.store(p_state, tl.exp(c_last) * s0 + _mm(tl.trans(decayed), delta, P, INTERPRET))


def rows_step(form: str, block_v: int, chunk: int, x: dict, state, rows_cache, t_cache, positions, precision: int = 2):
    """One decode step (a token a sequence) into a new [B, HV, DV] tensor (bf16, fp32 at ieee precision); the slots and states in place. `precision`:
    triton_tiles.PRECISIONS' (2, bf16 operands, as tiny-hybrid-triton's products; 0, ieee fp32)."""
    batch, hk, dk = x["q"].shape
    hv, dv = x["v"].shape[1:]
    out = x["v"].new_empty((batch, hv, dv), dtype=x["v"].dtype if precision else torch.float32)
    rows_step_kernel[(batch, hv, dv // block_v)](
        x["q"], x["k"], x["v"], x["a"], x["b"], x["a_log"], x["dt_bias"], out, state, rows_cache, t_cache, positions, float(dk**-0.5),
        HK=hk, HV=hv, DK=dk, DV=dv, BV=block_v, C=chunk, FORM=({**FORMS, **ABLATIONS}[form])[0], STAGE=({**FORMS, **ABLATIONS}[form])[1], P=precision, INTERPRET=triton_support.interpreting(), num_warps=4)
    return out


def split_block(programs: int, dv: int, sms: int) -> int:
    """@3's split rule (ops/gdn/triton.py SPLITS: 32 columns up to half an SM's programs, 64 up to one), capped at 64 here
    (a 128-column block spills in @3's kernel too)."""
    return 32 if programs <= 0.5 * sms else 64 if programs <= sms else min(64, dv)


def _steps(x: dict, batch: int, chunk: int):
    keys = ("q", "k", "v", "a", "b")
    return [{n: (t[i * batch : (i + 1) * batch] if n in keys else t) for n, t in x.items()} for i in range(chunk)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--shape", default="hk16-hv32-d128")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        return _check_on_cpu()
    from gdn import SHAPES, _cache, _contract_op, _decode_chunk, _fla, _inputs
    from timing import graphed_ms

    op, entry, row_width = _contract_op("tiny-hybrid-triton")
    rows_op, _, rows_width = _contract_op("tiny-hybrid-triton", inverse="rows")
    chunk = entry.constants["chunk_size"]
    fla, why = _fla()
    if fla is None:
        print(f"no flash-linear-attention baseline ({why})")
    shape = SHAPES[args.shape]
    hk, hv, dk, dv = shape
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for batch in map(int, args.batches.split(",")):
        generator = torch.Generator(device=device).manual_seed(batch)
        x = _inputs(shape, batch * chunk, device, generator)
        row = {}
        outputs = _decode_chunk(op, fla, x, shape, batch, chunk, row_width(*shape[1:]), device, torch.Generator(device=device).manual_seed(7),
                                row)
        parts = [f"b{batch:<3} @3 {row['contract_ms'] * 1e3:6.2f} us/step"]
        if "fla_ms" in row:
            parts.append(f"fla {row['fla_ms'] * 1e3:6.2f} ({row['contract_ms'] / row['fla_ms']:.2f}x)")
        # The op itself with `inverse = "rows"` (gdn.core.triton's constant), from the same state.
        rows_row = {}
        rows_out = _decode_chunk(rows_op, None, x, shape, batch, chunk, rows_width(*shape[1:]), device,
                                 torch.Generator(device=device).manual_seed(7), rows_row)
        diff = float((rows_out["contract"].float() - outputs["fla"].float()).abs().max()) if "fla" in outputs else float("nan")
        parts.append(f"[op, inverse rows] {rows_row['contract_ms'] * 1e3:6.2f} us"
                     + (f" ({rows_row['contract_ms'] / row['fla_ms']:.2f}x fla, max|diff| vs fla {diff:.1e})" if "fla_ms" in row else ""))
        steps = _steps(x, batch, chunk)
        positions = [torch.full((batch,), 2048 + i, device=device) for i in range(chunk)]
        block = split_block(batch * hv, dv, sms)
        for form in {**FORMS, **ABLATIONS}:
            state0, _ = _cache(shape, batch, chunk, row_width(*shape[1:]), device, torch.Generator(device=device).manual_seed(7))
            slot = torch.zeros(batch, chunk, hv, dk + dv + 16, device=device)
            t_slot = torch.zeros(batch, chunk, hv, chunk, device=device)

            def chunk_steps(s=state0, r=slot, t=t_slot):
                return torch.stack([rows_step(form, block, chunk, st, s, r, t, p) for st, p in zip(steps, positions)])

            with torch.no_grad():
                got = chunk_steps(state0.clone(), slot.clone(), t_slot.clone())
                ms = graphed_ms(chunk_steps, device) / chunk
            diff = float((got.float() - outputs["fla"].float()).abs().max()) if "fla" in outputs else float("nan")
            ref = float((outputs["contract"].float() - outputs["fla"].float()).abs().max()) if "fla" in outputs else float("nan")
            if form in ABLATIONS or "fla_ms" not in row:
                parts.append(f"[{form}, block {block}] {ms * 1e3:6.2f} us")
            else:
                parts.append(f"[{form}, block {block}] {ms * 1e3:6.2f} us ({ms / row['fla_ms']:.2f}x fla, max|diff| vs fla {diff:.1e}, "
                             f"@3's {ref:.1e})")
        print(f"{args.shape} decode chunk  " + "  ".join(parts), flush=True)


def _check_on_cpu() -> None:
    """In the interpreter, at small heads: a chunk and a half of decode steps by each form against gdn.core.reference's
    rows from the same state (the same function: close, not equal)."""
    from isoexec.ops.gdn import reference

    torch.manual_seed(0)
    hk, hv, dk, dv, chunk, batch = 2, 4, 16, 32, 16, 2
    steps_n = chunk + 7
    x = dict(q=torch.randn(steps_n * batch, hk, dk).bfloat16(), k=torch.randn(steps_n * batch, hk, dk).bfloat16(),
             v=torch.randn(steps_n * batch, hv, dv).bfloat16(), a=torch.randn(steps_n * batch, hv).bfloat16(),
             b=torch.randn(steps_n * batch, hv).bfloat16(), a_log=torch.rand(hv).log(), dt_bias=torch.rand(hv))
    state0 = torch.randn(batch, hv, dk, dv) * 0.05
    steps = _steps(x, batch, steps_n)
    # The reference's rows: each sequence's tokens as one packed prefill from the same state.
    seq = {n: (t.view(steps_n, batch, *t.shape[1:]).transpose(0, 1).reshape(-1, *t.shape[1:]) if t.dim() > 1 and t.shape[0] == steps_n * batch
               else t) for n, t in x.items()}
    positions = torch.arange(steps_n).repeat(batch) + 32
    constants = dict(input_dtype="bfloat16", output_dtype="float32", accum_dtype="float32", chunk_size=chunk, reduce_block=16,
                     block_tree="balanced_binary", tree="sequential")
    want = reference.gdn_core(seq["q"], seq["k"], seq["v"], seq["a"], seq["b"], x["a_log"], x["dt_bias"], state0.clone(),
                              torch.zeros(batch, chunk, hv, reference.row_width(hv, dk, dv)), torch.arange(batch).repeat_interleave(steps_n),
                              positions, **constants)
    want = want.view(batch, steps_n, hv, dv).transpose(0, 1)
    for form in FORMS:
        for block, precision, bound in ((dv, 2, 0.05), (dv // 2, 2, 0.05), (dv, 0, 1e-4)):
            state, slot = state0.clone(), torch.zeros(batch, chunk, hv, dk + dv + 16)
            t_slot = torch.zeros(batch, chunk, hv, chunk)
            got = torch.stack([rows_step(form, block, chunk, st, state, slot, t_slot, torch.full((batch,), 32 + i), precision)
                               for i, st in enumerate(steps)]).float()
            err = float((got - want).abs().max())
            print(f"cpu {form} block {block} {'bf16' if precision else 'fp32'} operands: max|diff| vs gdn.core.reference {err:.2e} "
                  f"(|rows| up to {float(want.abs().max()):.2f})")
            assert math.isfinite(err) and err < bound * float(want.abs().max()), err


if __name__ == "__main__":
    main()
