"""Tensor and expert parallelism from outside the model (isoexec.parallel), in real gloo processes on the CPU:
a trainer's rows at TP 2 and 4 (with sequence parallelism too), and an MoE model's at EP 2 and 4 with and
without TP and SP, bitwise equal to one process's; the engine and the trainer at different layouts bitwise equal in the audit; native's TP
composition (each rank's GEMM rounded, then summed by the collective) differing by construction; gradients
through the composed ops matching one process's; layouts the model or the contract cannot be cut into
refused in one line."""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import bitwise_equal, int_view, isoexec_here
from isoexec.audit import all_equal, run_audit
from isoexec.contract import fit_contract, load_preset
from isoexec.model import PRESETS, init_random
from isoexec.parallel import Mesh, check, shard, spawn
from isoexec.rl.handshake import side_fingerprint
from isoexec.runtime import REGISTRY, fingerprint
from isoexec.runtime.handshake import check as check_fingerprints
from isoexec.trainer import Trainer

SEQUENCES = [[(7 * i + 3 * j) % 500 for j in range(n)] for i, n in enumerate((9, 23, 40))]
SMALL = [[t % 13 for t in s] for s in SEQUENCES]  # for a vocabulary of 13


def _rows(mesh, contract_name, case, preset="tiny-dense", vocab_size=None, sequences=None):
    contract = load_preset(contract_name)
    spec = PRESETS[preset] if vocab_size is None else dataclasses.replace(PRESETS[preset], vocab_size=vocab_size)
    model = init_random(spec, seed=0)
    local = shard(model, contract, mesh) if mesh.world > 1 else model
    return [r.detach() for r in Trainer(local, contract, mesh).logprobs(sequences or SEQUENCES, case=case)]


def _differing(a, b) -> int:
    return sum(int((int_view(x) != int_view(y)).sum()) for x, y in zip(a, b))


def test_trainer_rows_are_the_same_bits_at_every_tp_size(tmp_path):
    """TP 2 (two heads, two key/value heads, four leaves a rank), its processes started by torchrun
    (`torchrun_rows.py`: the mesh read from torchrun's environment), and TP 4 (one head a rank, key/value heads
    replicated, two leaves a rank), started by spawn, against one process: every full-vocabulary row bit for bit
    (trainer_fwd's too, in the audits below)."""
    one = _rows_in(1, "tiny-dense")
    (tmp_path / "sequences.json").write_text(json.dumps(SEQUENCES))
    launched = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               str(Path(__file__).with_name("torchrun_rows.py")), str(tmp_path / "sequences.json"), str(tmp_path / "rows.pt")],
                              capture_output=True, text=True)
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert _differing(one, torch.load(tmp_path / "rows.pt")) == 0, "TP 2 under torchrun"
    assert _differing(one, _rows_in(4, "tiny-dense")) == 0, "TP 4"


def _rows_in(tp, contract_name, case="trainer_score", preset="tiny-dense", ep=1, sp=False):
    return spawn(tp, _rows, contract_name, case, preset, ep=ep, sp=sp)


def test_uneven_vocabulary_shards_give_the_same_bits():
    """A vocabulary of 520 tokens is 9 blocks of 64, the last one 8 tokens: at TP 4 the ranks hold 2, 2, 2 and 3
    blocks (the last rank the short one), whose per-block leaves are gathered and folded by the one tree;
    trainer_fwd's rows (autograd through the composed log-probs) against one process's, bit for bit."""
    one = spawn(1, _rows, "tiny-dense", "trainer_fwd", "tiny-dense", 520)
    assert one[0].shape[-1] == 520
    assert _differing(one, spawn(4, _rows, "tiny-dense", "trainer_fwd", "tiny-dense", 520)) == 0


def test_sequence_parallel_rows_are_the_same_bits():
    """TP 2 and 4 with the tokens cut over the ranks between the projections (72 tokens: 36 and 18 a rank)
    against one process, trainer_fwd (autograd through the gathers and the partial folds)."""
    one = _rows_in(1, "tiny-dense", "trainer_fwd")
    for tp in (2, 4):
        assert _differing(one, _rows_in(tp, "tiny-dense", "trainer_fwd", sp=True)) == 0, f"TP {tp} + SP"


@pytest.mark.parametrize("tp, ep, sp", [(1, 2, False), (2, 2, False), (1, 4, False), (2, 2, True), (4, 4, True)],
                         ids=["ep2", "tp2-ep2", "ep4", "tp2-ep2-sp", "tp4-ep4-sp"])
def test_moe_rows_are_the_same_bits_with_experts_cut_over_ranks(tp, ep, sp):
    """tiny-moe (6 experts, top-2; a dense first layer): routed experts split 3 + 3 or, unevenly, 1 + 2 + 1 + 2
    over the ranks, with attention and the dense MLP replicated or cut; with SP each rank routes its own tokens and
    sends their pairs to the experts' ranks by all-to-all. trainer_fwd's rows (autograd through the composed
    experts) against one process's, bit for bit."""
    one = _rows_in(1, "tiny-moe", "trainer_fwd", "tiny-moe")
    assert _differing(one, _rows_in(tp, "tiny-moe", "trainer_fwd", "tiny-moe", ep=ep, sp=sp)) == 0


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_hybrid_rows_are_the_same_bits_with_heads_cut_over_ranks(sp):
    """tiny-hybrid (three Gated DeltaNet layers of 2 key / 4 value heads, a gated attention layer): at TP 2 each
    rank holds one key head and the two value heads that read it (their in_proj_qkv and conv rows, z, b, a,
    A_log and dt_bias), runs the conv and the delta rule on them alone, and out_proj folds the ranks' leaves;
    with SP the tokens are cut between the projections. trainer_fwd's rows against one process's, bit for bit;
    the control, native at TP 2 (out_proj and o_proj each rank's GEMM rounded, then summed), differs."""
    one = _rows_in(1, "tiny-hybrid", "trainer_fwd", "tiny-hybrid")
    assert _differing(one, _rows_in(2, "tiny-hybrid", "trainer_fwd", "tiny-hybrid", sp=sp)) == 0
    native = _rows_in(1, "native", "trainer_fwd", "tiny-hybrid")
    assert _differing(native, _rows_in(2, "native", "trainer_fwd", "tiny-hybrid", sp=sp)) > 0


def test_native_tensor_parallelism_is_not_the_same_bits():
    """The control: native's o_proj and down_proj at TP 2 are each rank's GEMM over its half of K, rounded to
    bf16, then summed by the collective; one process rounds one GEMM over all of K. Two roundings against one:
    other bits by construction (here every element of every row)."""
    one, two = _rows_in(1, "native"), _rows_in(2, "native")
    assert _differing(one, two) > 0


def _contract_for(preset: str):
    """A model preset's contract preset: the hybrid family's for its presets, else the one of the same name."""
    return load_preset("tiny-hybrid" if preset.startswith(("tiny-hybrid", "tiny-qwen3-next")) else preset)


def _gradients(mesh, preset="tiny-dense"):
    spec = dataclasses.replace(PRESETS[preset], dtype="float32")  # fp32 weights and gradients: a tight tolerance
    contract = fit_contract(_contract_for(preset), spec)
    model = init_random(spec, seed=0)
    local = shard(model, contract, mesh) if mesh.world > 1 else model
    rows = Trainer(local, contract, mesh).logprobs(SEQUENCES, case="trainer_fwd")
    sum((r * torch.linspace(-1, 1, r.numel()).view_as(r)).sum() for r in rows).backward()
    return {name: p.grad.float() for name, p in local.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("preset, ep, sp", [("tiny-hybrid", 1, False), ("tiny-hybrid", 1, True), ("tiny-hybrid-moe", 2, True)],
                         ids=["tp2", "tp2-sp", "moe-tp2-ep2-sp"])
def test_hybrid_gradients_match_one_process(preset, ep, sp):
    """An fp32 hybrid model at TP 2: rank 0's rows of a Gated DeltaNet layer's weights (key head 0's q and k rows and
    value heads 0-1's v rows of in_proj_qkv and of the conv, z, b, a, A_log, dt_bias, out_proj's first half of K)
    and the gated norm's weight, which every rank uses for its heads (summed), against one process's; with MoE
    layers, rank 0's half of the shared expert (its columns, as a dense MLP's) and the shared expert's gate (with
    SP each rank's gradient covers its tokens: summed)."""
    full, rank0 = spawn(1, _gradients, preset), spawn(2, _gradients, preset, ep=ep, sp=sp)
    rows = lambda g: torch.cat([g[:16], g[32:48], g[64:80]])  # noqa: E731  (q: key head 0, k: key head 0, v: value heads 0-1)
    layer = "model.layers.1.linear_attn"
    checks = {f"{layer}.in_proj_qkv.weight": rows, f"{layer}.conv1d.weight": rows, f"{layer}.in_proj_z.weight": lambda g: g[:16],
              f"{layer}.in_proj_b.weight": lambda g: g[:2], f"{layer}.A_log": lambda g: g[:2], f"{layer}.dt_bias": lambda g: g[:2],
              f"{layer}.out_proj.weight": lambda g: g[:, :16], f"{layer}.norm.weight": lambda g: g}
    if preset == "tiny-hybrid-moe":  # a shared expert of 48 columns: 24 a rank
        mlp = "model.layers.1.mlp"
        checks |= {f"{mlp}.shared_expert.gate_proj.weight": lambda g: g[:24], f"{mlp}.shared_expert.down_proj.weight": lambda g: g[:, :24],
                   f"{mlp}.shared_expert_gate.weight": lambda g: g}
    for name, part in checks.items():
        want = part(full[name])
        assert rank0[name].shape == want.shape, name
        assert float((rank0[name] - want).norm() / want.norm()) < 1e-5, name


@pytest.mark.parametrize("tp, ep, sp", [(1, 2, False), (2, 2, True), (2, 1, True)], ids=["ep2", "tp2-ep2-sp", "tp2-sp"])
def test_expert_parallel_gradients_match_one_process(tp, ep, sp):
    """An fp32 tiny-moe: rank 0's experts (the first 3 of 6 at EP 2, all 6 at EP 1), the router and the embedding,
    against one process's gradients. EP 2: the experts' input gradient summed over the ranks, each owning some
    (token, slot)s; with SP, each rank's pairs sent to their experts' ranks and back by all-to-all, whose
    backward returns the rows' gradients; EP 1 with SP: the router's and the experts' gradients summed over the
    ranks, each having seen its own tokens."""
    full, rank0 = spawn(1, _gradients, "tiny-moe"), spawn(tp, _gradients, "tiny-moe", ep=ep, sp=sp)
    mine = slice(0, 6 // ep)
    for name, part in {"model.layers.1.mlp.experts.gate_up_proj": lambda g: g[mine], "model.layers.2.mlp.experts.down_proj": lambda g: g[mine],
                       "model.layers.1.mlp.gate.weight": lambda g: g, "model.embed_tokens.weight": lambda g: g[:256] if tp > 1 else g}.items():
        want = part(full[name])
        assert rank0[name].shape == want.shape, name
        assert float((rank0[name] - want).norm() / want.norm()) < 1e-5, name


@pytest.mark.parametrize("tp, sp", [(2, False), (2, True), (4, False)], ids=["tp2", "tp2-sp", "tp4"])
def test_gradients_through_the_composed_ops_match_one_process(tp, sp):
    """Rank 0's shard at TP 2 (sequence parallel or not) and TP 4, an fp32 model: the replicated weights' gradients
    (the norms: with sequence parallelism each rank's covers its tokens, q_norm and k_norm each rank's heads,
    summed over the ranks) and its own rows and columns of the sharded ones (the tied embedding and lm_head: its
    blocks of the vocabulary; at TP 4 key/value head 0, which ranks 0 and 1 both hold and read), against one
    process's, to float tolerance (gradients are reduced by any means)."""
    full, rank0 = _gradients_in(1), spawn(tp, _gradients, sp=sp)
    heads = 4 // tp  # query heads a rank, 16 rows each
    checks = {
        "model.embed_tokens.weight": lambda g: g[: 512 // tp],  # vocabulary blocks [0, 8 / TP) of 8
        "model.layers.0.input_layernorm.weight": lambda g: g,
        "model.layers.1.self_attn.q_norm.weight": lambda g: g,
        "model.layers.1.self_attn.k_norm.weight": lambda g: g,
        "model.layers.1.self_attn.q_proj.weight": lambda g: g[: 16 * heads],
        "model.layers.1.self_attn.k_proj.weight": lambda g: g[:16],  # key/value head 0 of 2
        "model.layers.1.self_attn.v_proj.weight": lambda g: g[:16],
        "model.layers.1.self_attn.o_proj.weight": lambda g: g[:, : 16 * heads],
        "model.layers.0.mlp.gate_proj.weight": lambda g: g[: 128 // tp],
        "model.layers.0.mlp.down_proj.weight": lambda g: g[:, : 128 // tp],
    }
    for name, part in checks.items():
        want = part(full[name])
        assert rank0[name].shape == want.shape, name
        assert float((rank0[name] - want).norm() / want.norm()) < 1e-5, name


def _gradients_in(tp):
    return spawn(tp, _gradients)


@pytest.mark.parametrize("preset, trainer, engine", [
    ("tiny-dense", (2, 1, False), (1, 1, False)), ("tiny-dense", (1, 1, False), (4, 1, True)), ("tiny-dense", (4, 1, False), (2, 1, False)),
    ("tiny-moe", (1, 1, False), (1, 2, False)), ("tiny-moe", (2, 2, True), (1, 3, False)),
    ("tiny-hybrid", (2, 1, True), (1, 1, False)), ("tiny-hybrid", (1, 1, False), (2, 1, False)), ("tiny-hybrid-moe", (2, 2, True), (1, 4, False)),
], ids=["dense-trainer-tp2", "dense-engine-tp4-sp", "dense-tp4-vs-tp2", "moe-engine-ep2", "moe-tp2ep2sp-vs-ep3", "hybrid-trainer-tp2-sp",
        "hybrid-engine-tp2", "hybrid-moe-tp2ep2sp-vs-ep4"])
def test_the_audit_is_bitwise_across_layouts(preset, trainer, engine):
    """The engine (paged cache, chunked prefill, preemption, prefix caching, sampling) at one (TP, EP, SP), the
    trainer at another: every sampled token, every full-vocabulary row and every routing equal."""
    model = init_random(PRESETS[preset], seed=0)
    contract = fit_contract(_contract_for(preset), model.spec)
    report = run_audit(model, contract, requests=6, max_new_tokens=8, progress=False, trainer_tp=trainer[0], trainer_ep=trainer[1],
                       trainer_sp=trainer[2], engine_tp=engine[0], engine_ep=engine[1], engine_sp=engine[2])
    assert all_equal(report), report["trainer_score"]
    assert report["layout"] == {side: {**dict(zip(("tp", "ep", "sp"), sizes)), "dp": 1} for side, sizes in (("trainer", trainer), ("engine", engine))}


@pytest.mark.parametrize("preset, tp, ep, message", [
    ("tiny-dense", 3, 1, "TP = 3 does not divide contract tiny-dense's 8 row-parallel leaves"),
    ("tiny-dense", 8, 1, "TP = 8 does not divide layer 0's 4 attention heads"),
    ("tiny-dense", 1, 2, "EP = 2 needs routed experts, and Qwen3ForCausalLM has no MoE layer"),
    ("tiny-moe", 1, 8, "EP = 8 exceeds layer 1's 6 experts"),
    ("tiny-moe", 2, 3, "tp and ep span the same ranks: each is 1 or both are equal, got tp = 2, ep = 3"),
    ("tiny-dense", 1, 1, "sequence parallelism cuts the tokens over the tensor-parallel ranks: it needs TP > 1"),
    ("tiny-hybrid", 4, 1, "TP = 4 does not divide layer 0's 2 Gated DeltaNet key heads"),
    ("tiny-mla", 2, 1, "tensor and expert parallelism shard gqa attention, gdn, mlp and moe layers so far; layer 0 is mla + mlp"),
    ("tiny-qwen3-next", 2, 1, "TP = 2 cuts the dense MLPs and shared experts by one down_proj width (the row-parallel op's K), and "
                              "Qwen3NextForCausalLM has 48, 128"),
])
def test_layouts_that_cannot_be_cut_are_refused(preset, tp, ep, message):
    sp = "sequence parallelism" in message
    with pytest.raises(ValueError, match=re.escape(message)):
        check(PRESETS[preset], _contract_for(preset), tp, ep, sp)


def _with_entry(contract, region, **changes):
    composition = tuple(dataclasses.replace(e, **changes) if e.region == region else e for e in contract.composition)
    return dataclasses.replace(contract, composition=composition)


def test_ranks_without_vocabulary_blocks():
    """The toy task's 13 tokens are one block of 64: at TP 2 rank 1 holds the whole vocabulary and rank 0 none (an
    empty embedding and lm_head, no leaves); trainer_fwd's rows against one process's, bit for bit."""
    one = spawn(1, _rows, "tiny-dense", "trainer_fwd", "tiny-dense", 13, SMALL)
    assert _differing(one, spawn(2, _rows, "tiny-dense", "trainer_fwd", "tiny-dense", 13, SMALL)) == 0


def test_a_bitwise_contract_needs_the_halves_its_cuts_run():
    """torch's log_softmax has no vocabulary-parallel form: a bitwise contract binding it cannot be cut by TP."""
    contract = load_preset("tiny-dense")
    native = _with_entry(contract, "logprobs", impl=dataclasses.replace(contract.entry("logprobs", "trainer_fwd").impl, id="logprobs.native"))
    check(PRESETS["tiny-dense"], native, 1)
    with pytest.raises(ValueError, match=r"logprobs.native@1 \(logprobs of contract tiny-dense\) has no vocabulary-parallel"):
        check(PRESETS["tiny-dense"], native, 2)


def test_a_bitwise_contract_refuses_sizes_it_does_not_claim():
    contract = load_preset("tiny-dense")
    restricted = dataclasses.replace(contract, claims=dataclasses.replace(contract.claims, topology=dataclasses.replace(
        contract.claims.topology, tp=(1, 2))))
    with pytest.raises(ValueError, match=r"claims its bits at TP 1, 2 only \(claims.topology.tp\)"):
        check(PRESETS["tiny-dense"], restricted, 4)


def _trainer_fingerprint(mesh):
    contract = load_preset("tiny-dense")
    model = init_random(PRESETS["tiny-dense"], seed=0)
    trainer = Trainer(shard(model, contract, mesh), contract, mesh)
    return side_fingerprint(trainer.binding, "trainer", spec=model.spec, mesh=trainer.mesh)


def test_fingerprints_carry_each_sides_sizes_and_the_handshake_holds_them_to_the_claims():
    """A TP 4 + SP trainer's rank 0 fingerprints its mesh; against a TP 1 engine the layouts differ and the handshake
    accepts them (the contract claims both); a contract claiming TP 1 and 2 refuses the trainer, naming the axis."""
    trainer = spawn(4, _trainer_fingerprint, sp=True)
    assert trainer["parallel"] == {"tp": 4, "ep": 1, "sp": True, "dp": 1}
    contract = load_preset("tiny-dense")
    engine = fingerprint(contract, REGISTRY.resolve(contract, contract.cases_of("engine")), role="engine")
    for fp in (trainer, engine):  # stand-ins for admission records: this test is about the layout
        for cells in fp["installed"].values():
            for cell in cells.values():
                cell["admitted"] = True
    assert check_fingerprints(trainer, engine).ok
    trainer["guarantees"]["topology"]["tp"] = [1, 2]
    assert [(p.scope, p.field, p.b) for p in check_fingerprints(trainer, engine).problems] == [("parallel", "tp", 4)]


def test_the_audit_command_refuses_a_bad_layout_in_one_line(capsys):
    result = isoexec_here(capsys, "audit", "--engine-tp", "3", "--quiet")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["isoexec: error: --engine-tp 3 --engine-ep 1: TP = 3 does not divide contract "
                                                  "tiny-dense's 8 row-parallel leaves"]


def test_a_rank_model_is_the_single_device_decoder_with_fewer_heads():
    """The plan only reshapes the spec and slices weights: rank 1 of TP 2 is a Decoder with 2 heads and 1
    key/value head a layer and half of each MLP, its q_proj rows the full model's heads 2 and 3."""
    contract = load_preset("tiny-dense")
    model = init_random(PRESETS["tiny-dense"], seed=0)
    rank1 = shard(model, contract, Mesh(tp=2, rank=1, group=object()))
    attention, mlp = rank1.spec.layers[0].mixer, rank1.spec.layers[0].ffn
    assert (attention.num_heads, attention.num_kv_heads, mlp.intermediate_size) == (2, 1, 64)
    assert bitwise_equal(rank1.model.layers[0].self_attn.q_proj.weight, model.model.layers[0].self_attn.q_proj.weight[32:])
    assert bitwise_equal(rank1.model.layers[0].mlp.down_proj.weight, model.model.layers[0].mlp.down_proj.weight[:, 64:])
    assert bitwise_equal(rank1.model.embed_tokens.weight, model.model.embed_tokens.weight[256:])  # vocabulary blocks 4-7 of 8
    assert rank1.lm_head.weight is rank1.model.embed_tokens.weight  # still tied
    assert rank1.unsharded_spec == model.spec


@pytest.mark.parametrize("preset,contract_name,mesh", [
    ("tiny-dense", "tiny-dense", dict(tp=2, rank=1)),
    ("tiny-moe", "tiny-moe", dict(tp=2, ep=2, rank=0)),
    ("tiny-hybrid-moe", "tiny-hybrid", dict(ep=4, rank=3)),
    ("tiny-hybrid-moe", "tiny-hybrid", dict(tp=2, rank=1, sp=True)),
    ("tiny-moe", "tiny-moe", dict(tp=2, ep=4, dp=2, rank=1, dp_rank=1)),  # the experts over both groups: EP rank 3's
])
def test_a_random_shard_is_the_shard_of_the_random_model(preset, contract_name, mesh):
    """What a rank of a parallel RL side draws for itself without the whole model (`random_shard`) is, weight for
    weight, the bits `shard` cuts from `init_random`'s model; another seed's is not."""
    from isoexec.parallel import random_shard

    spec, contract, mesh = PRESETS[preset], load_preset(contract_name), Mesh(group=object(), **mesh)
    drawn, cut = random_shard(spec, 3, contract, mesh).state_dict(), shard(init_random(spec, seed=3), contract, mesh).state_dict()
    assert drawn.keys() == cut.keys() and all(bitwise_equal(drawn[name], cut[name]) for name in cut)
    assert not bitwise_equal(random_shard(spec, 4, contract, mesh).state_dict()["model.norm.weight"], cut["model.norm.weight"])
