#!/usr/bin/env bash
# Issue 21's audits on one machine of several GPUs: the trainer and the engine each at its own layout, every
# rank a process on a GPU of its own, the collectives over NCCL (ISOEXEC_DIST_BACKEND=nccl). Each audit
# compares every sampled token's log-probability and every full-vocabulary row bit for bit; exit 0 where the
# contract's claims hold, 1 a mismatch under a contract that claims bitwise, 2 a layout refused (the line says
# why). native claims nothing bitwise: its audit exits 0 and its line shows the MISMATCH it must.
#
#   ISOEXEC_COMMIT=<sha> OUT=out bash benchmarks/multi_gpu.sh [tp|moe|sp|native|rl|all]    # repository root, 8 GPUs
#   DRY=1 OUT=out bash benchmarks/multi_gpu.sh all     # the same sequence on this machine's CPU: gloo, tiny models
#   ONE_GPU=1 OUT=out bash benchmarks/multi_gpu.sh all # tiny models under the Triton contracts, every rank on one GPU (gloo)
#
# tp: trainer TP x engine TP over {1, 2, 4, 8} on the Qwen3-8B-shaped random model (tiny-dense-triton);
# moe: the MoE presets at SkyRL-IsoExec's layout (trainer TP 4 / EP 8: two data-parallel groups of TP 4, the experts
#   over all 8 ranks; engine TP 8), its mirror (trainer TP 8, engine TP 4 / EP 8: two replicas in lockstep) and beside it; the hybrid preset with its Gated DeltaNet heads cut by TP; the
#   hybrid-MoE preset under EP, under TP + EP (its shared experts cut as a dense MLP), and at SkyRL-IsoExec's layout;
# sp: sequence parallelism on one side only; native: native's TP composition, which must differ.
# rl: synchronous GRPO steps (bench.py rl) with the trainer at SkyRL-IsoExec's TP 4 / EP 8 (DP 2) and the engine at
#   TP 8 / EP 8, then the mirror: the trainer at TP 8 / EP 8, the engine at TP 4 / EP 8 (DP 2) (RL_LAYOUTS="a b": others), on the
#   hybrid-MoE preset with 35B-A3B's layer shapes and 4 layers (RL_MODEL=… another), the contract beside the fast
#   baseline in one run. Each rank draws its own shard and the weights cross rank to rank (rl/transfer.py), so all 40
#   layers (RL_MODEL=qwen3.5-35b-a3b-random) are bounded by memory: a trainer rank holds its shard's bfloat16
#   weights and gradients, float32 masters and gradients and two AdamW moments, 20 bytes a parameter (~175 GB a rank
#   at 4 trainer ranks: use trainer_tp=8,trainer_ep=8).
# One line per audit in $OUT/multi_gpu.txt, the reports in $OUT/multi_gpu_json.tar; the rl rows in $OUT/multi_gpu/rl_*.json.
set -u
OUT=${OUT:-multi_gpu_out}
PART=${1:-all}
mkdir -p "$OUT/multi_gpu" /tmp/multi_gpu
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
if [ "${DRY:-0}" = 1 ]; then
    DEVICE=cpu SIZES="1 2 4" DENSE=tiny-dense DENSE_C=tiny-dense MOE=tiny-moe MOE_C=tiny-moe HYBRID=tiny-hybrid HYBRID_MOE=tiny-hybrid-moe
    HYBRID_C=tiny-hybrid LOAD="--requests 4 --max-new-tokens 4" BIG=4 HALF=2 HYBRID_TP=2 RL_SIZE=--small RL_ENGINE=engine_ep=4 RL_MIRROR=trainer_ep=4
    export ISOEXEC_DIST_BACKEND=gloo
elif [ "${ONE_GPU:-0}" = 1 ]; then  # the GPU's kernels, CUDA IPC and the GPU paths of the parallel code, on one GPU
    DEVICE=cuda SIZES="1 2 4" DENSE=tiny-dense DENSE_C=tiny-dense-triton MOE=tiny-moe MOE_C=tiny-moe-triton HYBRID=tiny-hybrid
    HYBRID_MOE=tiny-hybrid-moe HYBRID_C=tiny-hybrid-triton LOAD="--requests 4 --max-new-tokens 8" BIG=4 HALF=2 HYBRID_TP=2 RL_SIZE=--small
    RL_ENGINE=engine_ep=4 RL_MIRROR=trainer_ep=4  # a data-parallel trainer on one GPU (gloo) is refused in one line: its rows show it
    export ISOEXEC_DIST_BACKEND=gloo
else
    DEVICE=cuda SIZES="1 2 4 8" DENSE=qwen3-8b-random DENSE_C=tiny-dense-triton MOE=qwen3-30b-a3b-4l-random MOE_C=tiny-moe-triton
    HYBRID=qwen3.5-9b-4l-random HYBRID_MOE=qwen3.5-35b-a3b-4l-random HYBRID_C=tiny-hybrid-triton LOAD="--requests 8 --max-new-tokens 32"
    BIG=8 HALF=4 HYBRID_TP=8 RL_SIZE= RL_ENGINE=engine_tp=8,engine_ep=8 RL_MIRROR=trainer_tp=8,trainer_ep=8
    export ISOEXEC_DIST_BACKEND=nccl
fi
# The contracts with every layout claimed (a preset claims the layouts its tests ran).
for preset in "$DENSE_C" "$MOE_C" "$HYBRID_C"; do
python3 -m isoexec contract show --preset "$preset" --json | python3 -c '
import json, sys
c = json.load(sys.stdin)
c["name"] += "-layouts"
c["claims"]["topology"] = {"tp": [1, 2, 4, 8], "ep": [1, 2, 4, 8], "sp": [False, True]}
print(json.dumps(c, indent=1))' > "/tmp/multi_gpu/$preset-layouts.json"
done
D=/tmp/multi_gpu/$DENSE_C-layouts.json M=/tmp/multi_gpu/$MOE_C-layouts.json H=/tmp/multi_gpu/$HYBRID_C-layouts.json
audit() {  # name, then isoexec audit's arguments
    local name=$1; shift
    local start=$SECONDS
    timeout 900 python3 -m isoexec audit --device "$DEVICE" --quiet $LOAD --json "$OUT/multi_gpu/$name.json" "$@" > "/tmp/multi_gpu/$name.log" 2>&1
    local rc=$?
    echo "$name  exit $rc  $((SECONDS - start)) s  $(grep -E '^  trainer_score|bitwise|MISMATCH|error' "/tmp/multi_gpu/$name.log" | head -2 | tr -s ' ' | tr '\n' ' ' | cut -c1-220)" \
        | tee -a "$OUT/multi_gpu.txt"
    [ -f "$OUT/multi_gpu/$name.json" ] && tar -rf "$OUT/multi_gpu_json.tar" -C "$OUT/multi_gpu" "$name.json" && rm "$OUT/multi_gpu/$name.json"
}
echo "== $(date -u +%FT%TZ) device $DEVICE, backend $ISOEXEC_DIST_BACKEND, commit ${ISOEXEC_COMMIT:-?}" | tee -a "$OUT/multi_gpu.txt"
if [ "$PART" = tp ] || [ "$PART" = all ]; then
    for t in $SIZES; do for e in $SIZES; do
        [ "$t" = 1 ] && [ "$e" = 1 ] && continue
        audit "tp_${t}_vs_${e}" --model "$DENSE" --contract "$D" --trainer-tp "$t" --engine-tp "$e"
    done; done
fi
if [ "$PART" = moe ] || [ "$PART" = all ]; then
    audit "moe_ep${BIG}_vs_tp${BIG}" --model "$MOE" --contract "$M" --trainer-ep "$BIG" --engine-tp "$BIG"
    audit "moe_tp${BIG}_vs_ep${BIG}" --model "$MOE" --contract "$M" --trainer-tp "$BIG" --engine-ep "$BIG"
    audit "moe_tp${BIG}ep${BIG}_vs_tp${BIG}" --model "$MOE" --contract "$M" --trainer-tp "$BIG" --trainer-ep "$BIG" --engine-tp "$BIG"
    audit "moe_tp${HALF}ep${BIG}dp2_vs_tp${BIG}" --model "$MOE" --contract "$M" --trainer-tp "$HALF" --trainer-ep "$BIG" --trainer-dp 2 --engine-tp "$BIG"
    audit "moe_tp${HALF}ep${BIG}dp2sp_vs_tp${BIG}ep${BIG}" --model "$MOE" --contract "$M" --trainer-tp "$HALF" --trainer-ep "$BIG" --trainer-dp 2 \
        --trainer-sp --engine-tp "$BIG" --engine-ep "$BIG"
    audit "moe_tp${BIG}_vs_tp${HALF}ep${BIG}dp2" --model "$MOE" --contract "$M" --trainer-tp "$BIG" --engine-tp "$HALF" --engine-ep "$BIG" --engine-dp 2
    audit "hybrid_tp${HYBRID_TP}sp_vs_tp2" --model "$HYBRID" --contract "$H" --trainer-tp "$HYBRID_TP" --trainer-sp --engine-tp 2
    audit "hybrid_moe_ep${BIG}_vs_ep2" --model "$HYBRID_MOE" --contract "$H" --trainer-ep "$BIG" --engine-ep 2
    audit "hybrid_moe_tp2_vs_ep${BIG}" --model "$HYBRID_MOE" --contract "$H" --trainer-tp 2 --trainer-ep 2 --engine-ep "$BIG"
    audit "hybrid_moe_tp${HALF}ep${BIG}dp2_vs_ep${BIG}" --model "$HYBRID_MOE" --contract "$H" --trainer-tp "$HALF" --trainer-ep "$BIG" --trainer-dp 2 \
        --engine-ep "$BIG"
    audit "hybrid_moe_ep${BIG}_vs_tp${HALF}ep${BIG}dp2" --model "$HYBRID_MOE" --contract "$H" --trainer-ep "$BIG" --engine-tp "$HALF" --engine-ep "$BIG" \
        --engine-dp 2
fi
if [ "$PART" = sp ] || [ "$PART" = all ]; then
    audit "sp_trainer_tp4sp_vs_tp2" --model "$DENSE" --contract "$D" --trainer-tp 4 --trainer-sp --engine-tp 2
    audit "sp_engine_tp${BIG}sp_vs_tp1" --model "$DENSE" --contract "$D" --engine-tp "$BIG" --engine-sp
fi
if [ "$PART" = native ] || [ "$PART" = all ]; then
    audit "native_tp2_vs_4" --model "$DENSE" --contract native --trainer-tp 2 --engine-tp 4
fi
if [ "$PART" = rl ] || [ "$PART" = all ]; then
    BASELINE=benchmarks/contracts/fast-baseline.toml
    [ "${DRY:-0}" = 1 ] && BASELINE=native  # the fast baseline's kernels are the GPU's
    for layout in ${RL_LAYOUTS:-"trainer_tp=$HALF,trainer_ep=$BIG,trainer_dp=2,$RL_ENGINE" "$RL_MIRROR,engine_tp=$HALF,engine_ep=$BIG,engine_dp=2"}; do
        name="rl_$(echo "$layout" | tr ',=' '_-')"
        start=$SECONDS
        timeout 1800 python3 benchmarks/bench.py rl --device "$DEVICE" $RL_SIZE --rl-model "${RL_MODEL:-$HYBRID_MOE}" --contracts "$H,$BASELINE" \
            --rl-layout "$layout" --json "$OUT/multi_gpu/$name.json" > "/tmp/multi_gpu/$name.log" 2>&1
        echo "$name  exit $?  $((SECONDS - start)) s  $(grep -E '_time_over_.*_step|bitwise|failed' "/tmp/multi_gpu/$name.log" | tr -s ' ' | tr '\n' ' ' | cut -c1-300)" \
            | tee -a "$OUT/multi_gpu.txt"
    done
fi
rmdir "$OUT/multi_gpu" 2>/dev/null  # left when the rl part wrote its rows there
true
