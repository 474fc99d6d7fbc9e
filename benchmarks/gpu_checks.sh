#!/usr/bin/env bash
# The GPU side of the test suite, in one call on the device machine:
# the Triton / CUDA-graph tests compiled for the GPU, admission of the GPU contract and of native, and
# the GPU audits (tiny-dense and a Qwen3-0.6B-sized random model). Everything lands under $OUT.
#
#   OUT=out bash benchmarks/gpu_checks.sh [tests|admission|audits|parallel|moe-tests|moe-admission|moe-audits|moe-bench|mla-tests|mla-admission|mla-audits|mla-bench|gdn-tests|gdn-admission|gdn-audits|gdn-bench|gdn-two-launch|gdn-retime|gdn-rows|gdn-rows-audits|gdn-decode|attention-fold|attention-blocks|attention-gluon|attention-gluon-bench|attention-probes|attention-spread|attention-spans|attention-spans-engine|attention-profile|attention-knobs|attention-trees|attention-audits]   # from the repository root
#
# The whole takes ~10 minutes on one H200 (pytest 3, the 0.6B admission 5: its decode GEMM entries compile
# many shapes), over a device call's 10-minute limit with the start: name one part per call there.
#
# The moe-* parts do the same for the MoE family (tiny-moe-triton; the Qwen3-30B-A3B-shaped 4-layer preset);
# moe-bench times one MoE layer (bench.py moe) and the engine and trainer on that preset against the fast
# baseline and native (about 6 minutes; set ISOEXEC_COMMIT).
#
# The mla-* parts do the same for the MLA + MoE families (tiny-mla-triton on tiny-mla; the GLM-4.7-Flash-shaped
# 4-layer preset, whose admission here covers the regions it adds: mla, the norms and projections of its
# widths, and the MoE regions at its experts); mla-bench times mla_attn per phase (bench.py mla) and the engine
# and trainer on that preset against the fast baseline and native.
#
# The gdn-* parts do the same for the hybrid Gated DeltaNet families (tiny-hybrid-triton; the Qwen3.5-9B- and
# 35B-A3B-shaped 4-layer presets, audits with generations that cross several of the contract's 32-token chunks,
# decode as CUDA graphs); gdn-bench times
# gdn_core per phase against flash-linear-attention (bench.py gdn; carry fla-core's wheel, `pip install --no-deps --target
# /tmp/site` it and run with PYTHONPATH=/tmp/site) and the engine and trainer on the 9B-shaped preset against native.
#
# Files worth keeping go in benchmarks/results/<date>_<commit>_checks/ (index: benchmarks/results/README.md).
# The device tool brings back at most 8 files from $OUT: a part that writes more (gdn-two-launch) is best followed by
# `tar cf $OUT/out.tar -C $OUT --exclude out.tar .` in the same call.
set -u
OUT=${OUT:-gpu_out}
PART=${1:-all}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"

if [ "$PART" = all ] || [ "$PART" = tests ]; then
python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -25 | tee "$OUT/pytest.txt"
fi

if [ "$PART" = all ] || [ "$PART" = admission ]; then
for contract in tiny-dense-triton native; do
    python3 -m isoexec validate --device cuda --contract "$contract" --json "$OUT/validate_$contract.json" 2>&1 | tail -15 | tee "$OUT/validate_$contract.txt"
done

# The GPU contract as fitted to the Qwen3-0.6B-sized model (its GEMM tiles and row-kernel constants).
python3 -m isoexec validate --device cuda --contract tiny-dense-triton --model qwen3-0.6b-random --json "$OUT/validate_0.6b.json" 2>&1 | tail -12 | tee "$OUT/validate_0.6b.txt"
fi

if [ "$PART" = all ] || [ "$PART" = audits ]; then
python3 -m isoexec audit --device cuda --quiet --contract tiny-dense-triton --json "$OUT/audit_tiny_triton.json" 2>&1 | tail -12 | tee "$OUT/audit_tiny_triton.txt"
# No --trace under the GPU contract: tracing runs decode eagerly, and the audit should see the CUDA graphs.
python3 -m isoexec audit --device cuda --quiet --model qwen3-0.6b-random --contract tiny-dense-triton \
    --json "$OUT/audit_0.6b_tiny-dense-triton.json" 2>&1 | tail -14 | tee "$OUT/audit_0.6b_tiny-dense-triton.txt"
python3 -m isoexec audit --device cuda --quiet --model qwen3-0.6b-random --contract native --trace \
    --json "$OUT/audit_0.6b_native.json" 2>&1 | tail -14 | tee "$OUT/audit_0.6b_native.txt"
fi

if [ "$PART" = moe-tests ]; then
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/moe tests/engine/test_routing.py tests/test_audit.py 2>&1 | tail -15 | tee "$OUT/pytest_moe.txt"
fi

if [ "$PART" = moe-admission ]; then
python3 -m isoexec validate --device cuda --contract tiny-moe-triton --json "$OUT/validate_tiny-moe-triton.json" 2>&1 | tail -16 | tee "$OUT/validate_tiny-moe-triton.txt"
python3 -m isoexec validate --device cuda --contract tiny-moe-triton --model qwen3-30b-a3b-4l-random --json "$OUT/validate_30b.json" 2>&1 | tail -16 | tee "$OUT/validate_30b.txt"
fi

if [ "$PART" = moe-audits ]; then
for contract in tiny-moe-triton native; do
python3 -m isoexec audit --device cuda --quiet --model qwen3-30b-a3b-4l-random --contract "$contract" --requests 16 --max-new-tokens 16 \
    --json "$OUT/audit_30b_$contract.json" 2>&1 | tail -10 | tee "$OUT/audit_30b_$contract.txt"
done
fi

if [ "$PART" = moe-bench ]; then
(cd benchmarks && PYTHONPATH=../src python3 bench.py moe --json "$OUT/bench_moe.json" 2>&1 | tail -8 | tee "$OUT/bench_moe.txt")
(cd benchmarks && PYTHONPATH=../src python3 bench.py engine trainer --cuda-graphs --model qwen3-30b-a3b-4l-random \
    --contracts tiny-moe-triton,contracts/fast-baseline.toml,native --json "$OUT/bench_30b.json" 2>&1 | tail -12 | tee "$OUT/bench_30b.txt")
fi

if [ "$PART" = mla-tests ]; then
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/mla tests/ops/rope tests/model/families/test_mla_families.py 2>&1 | tail -15 | tee "$OUT/pytest_mla.txt"
fi

if [ "$PART" = mla-admission ]; then
python3 -m isoexec validate --device cuda --contract tiny-mla-triton --model tiny-mla --json "$OUT/validate_tiny-mla-triton.json" 2>&1 | tail -16 | tee "$OUT/validate_tiny-mla-triton.txt"
python3 -m isoexec validate --device cuda --contract tiny-mla-triton --model glm-4.7-flash-4l-random --region mla --region rms_norm \
    --region moe.router --region moe.experts --region moe.combine --json "$OUT/validate_glm.json" 2>&1 | tail -16 | tee "$OUT/validate_glm.txt"
fi

if [ "$PART" = mla-audits ]; then
for contract in tiny-mla-triton native; do
python3 -m isoexec audit --device cuda --quiet --model glm-4.7-flash-4l-random --contract "$contract" --requests 16 --max-new-tokens 16 \
    --json "$OUT/audit_glm_$contract.json" 2>&1 | tail -10 | tee "$OUT/audit_glm_$contract.txt"
done
fi

if [ "$PART" = mla-bench ]; then
(cd benchmarks && PYTHONPATH=../src python3 bench.py mla --json "$OUT/bench_mla.json" 2>&1 | grep -v Warning | tail -12 | tee "$OUT/bench_mla.txt")
(cd benchmarks && PYTHONPATH=../src python3 bench.py engine trainer --cuda-graphs --model glm-4.7-flash-4l-random \
    --contracts tiny-mla-triton,contracts/fast-baseline.toml,native --json "$OUT/bench_glm.json" 2>&1 | tail -12 | tee "$OUT/bench_glm.txt")
fi

if [ "$PART" = gdn-tests ]; then
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn tests/model/families/test_hybrid_family.py 2>&1 | tail -15 | tee "$OUT/pytest_gdn.txt"
fi

if [ "$PART" = gdn-admission ]; then
python3 -m isoexec validate --device cuda --contract tiny-hybrid-triton --model tiny-hybrid --json "$OUT/validate_tiny-hybrid-triton.json" 2>&1 | tail -20 | tee "$OUT/validate_tiny-hybrid-triton.txt"
python3 -m isoexec validate --device cuda --contract tiny-hybrid-triton --model qwen3.5-9b-4l-random --region gdn.core --region gdn.conv \
    --region rms_norm.gated --region activation.gate --region attention --region rms_norm --json "$OUT/validate_9b.json" 2>&1 | tail -16 | tee "$OUT/validate_9b.txt"
fi

if [ "$PART" = gdn-audits ]; then
for model in qwen3.5-9b-4l-random qwen3.5-35b-a3b-4l-random; do
for contract in tiny-hybrid-triton native; do
python3 -m isoexec audit --device cuda --quiet --model "$model" --contract "$contract" --requests 8 --max-new-tokens 140 \
    --json "$OUT/audit_${model}_$contract.json" 2>&1 | tail -8 | tee "$OUT/audit_${model}_$contract.txt"
done
done
fi

if [ "$PART" = gdn-bench ]; then
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 bench.py gdn --json "$OUT/bench_gdn.json" 2>&1 | grep -v Warning | tail -30 | tee "$OUT/bench_gdn.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 bench.py engine trainer --model qwen3.5-9b-4l-random \
    --contracts tiny-hybrid-triton,native --json "$OUT/bench_9b.json" 2>&1 | tail -12 | tee "$OUT/bench_9b.txt")
fi

# gdn.core.triton's inverse by rows (`inverse = "rows"`, docs/gdn.md; carry fla-core's wheel as for gdn-bench). gdn-rows:
# the GPU tests of every form with it (the contract's chunk, heads of 128), the decode step over a chunk against the
# products inverse, FLA and the standalone probe (gdn_rows_decode.py), and bench.py gdn's training, prefill and decode
# phases at one head shape with each inverse (about 7 minutes). gdn-rows-audits: the 9B- and 35B-A3B-shaped presets'
# audits under tiny-hybrid-triton with inverse = "rows" (a contract file written to /tmp), and the 9B preset's engine
# and trainer with it beside the preset and native.
if [ "$PART" = gdn-rows ]; then
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -k "rows and (contract or not qwen)" 2>&1 | tail -4 | tee "$OUT/pytest_gdn_rows.txt"
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} timeout 120 python3 gdn_rows_decode.py --batches 1,2,4,8,16 2>&1 | grep -v -i warn | tee "$OUT/gdn_rows_decode.txt")
for inverse in products rows; do
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} timeout 150 python3 bench.py gdn --gdn-shapes hk16-hv32-d128 --gdn-inverse "$inverse" \
    --json "$OUT/bench_gdn_$inverse.json" 2>&1 | grep -v Warning | tail -16 | tee "$OUT/bench_gdn_$inverse.txt")
done
fi

if [ "$PART" = gdn-rows-audits ]; then
python3 -m isoexec contract show tiny-hybrid-triton --json | python3 -c '
import json, sys
c = json.load(sys.stdin)
c["name"] += "-rows"
for e in c["composition"]:
    if e["region"] == "gdn.core":
        e["constants"]["inverse"] = "rows"
json.dump(c, open("/tmp/hybrid_rows.json", "w"), indent=1)'
for model in qwen3.5-9b-4l-random qwen3.5-35b-a3b-4l-random; do
python3 -m isoexec audit --device cuda --quiet --model "$model" --contract /tmp/hybrid_rows.json --requests 8 --max-new-tokens 140 \
    --json "$OUT/audit_${model}_rows.json" 2>&1 | tail -8 | tee "$OUT/audit_${model}_rows.txt"
done
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 bench.py engine trainer --model qwen3.5-9b-4l-random \
    --contracts /tmp/hybrid_rows.json,tiny-hybrid-triton,native --json "$OUT/bench_9b_rows.json" 2>&1 | tail -14 | tee "$OUT/bench_9b_rows.txt")
fi

# gdn-decode: after a change to the GDN decode step (carry fla-core's wheel as for gdn-bench): the contract forms' GPU
# tests at Qwen3.5's heads, a chunk of decode steps at batch 1-16 beside FLA's (profile_gdn_decode.py --part rows), and
# ncu's per-instruction stall samples of a batch-1 and a batch-2 step's kernel, in ncu.tar
# (benchmarks/results/2026-12-07_8aeec9a_h100_gdn_decode_ncu/ncu_stalls.py reads them; about 5 minutes).
if [ "$PART" = gdn-decode ]; then
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -k "qwen and contract" 2>&1 | tail -3 | tee "$OUT/pytest_gdn_contract.txt"
for only in "op, inverse products" fla; do
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} timeout 120 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8,16 --only "$only" \
    2>&1 | grep "^==" | tee -a "$OUT/gdn_decode_steps.txt")
done
for batch in 1 2; do
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} timeout 170 ncu --kernel-name regex:gdn_fwd_kernel --launch-skip 21 --launch-count 1 \
    --set full --import-source yes -f -o "$OUT/op_b$batch" python3 profile_gdn_decode.py --part rows --untimed --batches "$batch" \
    --only "op, inverse products" > /dev/null 2>&1)
ncu -i "$OUT/op_b$batch.ncu-rep" --page source --csv --print-source sass > "$OUT/op_b${batch}_sass.csv" 2>&1
tar -rf "$OUT/ncu.tar" -C "$OUT" "op_b${batch}_sass.csv" && rm -f "$OUT/op_b$batch.ncu-rep" "$OUT/op_b${batch}_sass.csv"
done
fi

# gdn.core.triton's two-launch path (docs/gdn.md; carry fla-core's wheel as for gdn-bench): the bits of every form by
# each path and their times beside FLA's (gdn_bits.py), the forward's kernels in one launch and in two
# (profile_gdn_fwd.py), the GPU tests, the audits with calls whose runs average 32 tokens or more in two launches, and
# the 9B preset's engine and trainer with two launches off and at their default.
if [ "$PART" = gdn-two-launch ]; then
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 gdn_bits.py --json "$OUT/gdn_bits.json" 2>&1 | grep -v Warning | tee "$OUT/gdn_bits.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 profile_gdn_fwd.py 2>&1 | grep -v Warning | tee "$OUT/profile_gdn_fwd.txt")
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py 2>&1 | tail -8 | tee "$OUT/pytest_gdn_triton.txt"
for model in qwen3.5-9b-4l-random qwen3.5-35b-a3b-4l-random; do
ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN=32 ISOEXEC_GDN_TWO_LAUNCH_MAX_FILL=off python3 -m isoexec audit --device cuda --quiet --model "$model" \
    --contract tiny-hybrid-triton --requests 8 --max-new-tokens 140 --json "$OUT/audit_two_launch_$model.json" 2>&1 | tail -8 \
    | tee "$OUT/audit_two_launch_$model.txt"
done
for min_run in off ""; do
(cd benchmarks && ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN=$min_run PYTHONPATH=../src:${PYTHONPATH:-} python3 bench.py \
    engine trainer --model qwen3.5-9b-4l-random --contracts tiny-hybrid-triton --json "$OUT/bench_9b_min_run_${min_run:-default}.json" 2>&1 \
    | tail -8 | tee "$OUT/bench_9b_min_run_${min_run:-default}.txt")
done
fi

# gdn.core.triton's calls against their kernels after a host-side change (carry fla-core's wheel): the forward's kernels
# and calls in one launch and in two (profile_gdn_fwd.py), the step's kernels with the backward's registers and spills
# (profile_gdn_bwd.py), the per-phase table against FLA (bench.py gdn), the scan-rows design's lower bound (gdn_designs.py), decode
# steps unsplit and split by the rule (gdn_split.py), the 9B preset's trainer against native; one tar
# of it all (the device brings back 8 files).
if [ "$PART" = gdn-retime ]; then
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 profile_gdn_fwd.py 2>&1 | grep -v Warning | tee "$OUT/profile_gdn_fwd.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 profile_gdn_bwd.py 2>&1 | grep -v Warning | tee "$OUT/profile_gdn_bwd.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 bench.py gdn --gdn-shapes "${GDN_SHAPES:-hk16-hv32-d128}" --json "$OUT/bench_gdn.json" 2>&1 | grep -v Warning | tail -36 \
    | tee "$OUT/bench_gdn.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} timeout 60 python3 gdn_designs.py --shapes hk16-hv32-d128 --json "$OUT/gdn_designs.json" 2>&1 \
    | grep -v Warning | tee "$OUT/gdn_designs.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} timeout 120 python3 gdn_split.py --shape hk16-hv32-d128 --splits none,rule \
    --json "$OUT/gdn_split.json" 2>&1 | grep -v Warning | tee "$OUT/gdn_split.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} timeout 120 python3 gdn_split.py --shape hk16-hv32-d128 --splits none,32,64 --warps 2,1 \
    --batches 1,2,4 --json "$OUT/gdn_split_warps.json" 2>&1 | grep -v Warning | tee "$OUT/gdn_split_warps.txt")
(cd benchmarks && PYTHONPATH=../src:${PYTHONPATH:-} python3 bench.py trainer --model qwen3.5-9b-4l-random --contracts tiny-hybrid-triton,native \
    --json "$OUT/bench_9b_trainer.json" 2>&1 | tail -8 | tee "$OUT/bench_9b_trainer.txt")
tar cf "$OUT/gdn_retime.tar" -C "$OUT" --exclude gdn_retime.tar .
fi

# attention.triton's key block (the online softmax's fold, which decides the bits) at 32, 64 and 128 keys: decode rows
# against the trainer's, then prefill and decode against flash SDPA (attention_fold.py; about 4 minutes for 4 configs).
if [ "$PART" = attention-fold ]; then
(cd benchmarks && OUT="$OUT" CONFIGS=${CONFIGS:-7} PYTHONPATH=../src python3 attention_fold.py 2>&1 | tee "$OUT/attention_fold.txt")
fi

# attention.triton's decode rows with the key blocks spread over the grid (ops/attention/triton_blocks.py, forced on)
# against the walk and flash SDPA: differing elements (must be 0) and graph-replay times at Qwen3-8B's heads.
if [ "$PART" = attention-blocks ]; then
(cd benchmarks && PYTHONPATH=../src python3 attention_blocks.py --out "$OUT/attention_blocks.txt" 2>&1 | grep -v Warning)
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention 2>&1 | tail -4 | tee "$OUT/pytest_attention.txt"
# The 8B-shaped model's audit with every decode step's attention spread (CUDA graphs), then its engine with and without (short
# contexts: the three launches' cost where the walk has few blocks; the engine runs may need a call of their own).
ISOEXEC_ATTENTION_BLOCKS_MIN=1 python3 -m isoexec audit --device cuda --quiet --model qwen3-8b-random --contract tiny-dense-triton \
    --json "$OUT/audit_8b_blocks.json" 2>&1 | tail -8 | tee "$OUT/audit_8b_blocks.txt"
for blocks in off 1; do
(cd benchmarks && ISOEXEC_ATTENTION_BLOCKS_MIN=$blocks PYTHONPATH=../src python3 bench.py engine --model qwen3-8b-random --cuda-graphs \
    --json "$OUT/bench_8b_engine_blocks_$blocks.json" 2>&1 | tail -6 | tee "$OUT/bench_8b_engine_blocks_$blocks.txt")
done
fi

# The tile in Gluon (issue 22): the probe (attention.triton's Gluon tile, gluon_tile.py, and the walk's order written on
# its block step, their bits against the Triton walk's and their times beside flash: benchmarks/attention_gluon.py); the
# tile's GPU tests; the 8B audit with the tile on (ISOEXEC_ATTENTION_GLUON=1). attention-gluon-bench: the engine (CUDA
# graphs), roofline and trainer on both presets with the tile (+gluon, variants.py) beside the walk and the fast baseline.
if [ "$PART" = attention-gluon ]; then
PYTHONPATH=src python3 benchmarks/attention_gluon.py --compile-only 2>&1 | tee "$OUT/attention_gluon.txt"
(cd benchmarks && PYTHONPATH=../src python3 attention_gluon.py --out "$OUT/attention_gluon.txt" 2>&1 | grep -v Warning | tail -20)
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_gluon_tile.py 2>&1 | tail -15 | tee "$OUT/pytest_gluon_tile.txt"
ISOEXEC_ATTENTION_GLUON=1 python3 -m isoexec audit --device cuda --quiet --model qwen3-8b-random --contract tiny-dense-triton \
    --json "$OUT/audit_8b_gluon.json" 2>&1 | tail -8 | tee "$OUT/audit_8b_gluon.txt"
fi
if [ "$PART" = attention-gluon-bench ]; then
(cd benchmarks && PYTHONPATH=../src python3 bench.py engine roofline trainer --cuda-graphs \
    --contracts tiny-dense-triton+gluon,tiny-dense-triton,contracts/fast-baseline.toml --json "$OUT/bench_gluon.json" 2>&1 \
    | grep -E "^(engine|roofline|trainer|bench)" | tee "$OUT/bench_gluon.txt")
fi

# The spread decode and the Gluon tile in one call: their bits and times
# against the walk and flash (attention_blocks.py, attention_gluon.py), then the engine and roofline on both presets
# with each beside the walk and the fast baseline (bench.py's +walk and +gluon entries, variants.py).
if [ "$PART" = attention-probes ]; then
(cd benchmarks && PYTHONPATH=../src timeout 150 python3 attention_blocks.py --out "$OUT/attention_blocks.txt" 2>&1 | grep -v Warning)
(cd benchmarks && PYTHONPATH=../src timeout 200 python3 attention_gluon.py --out "$OUT/attention_gluon.txt" 2>&1 | grep -v Warning | tail -20)
(cd benchmarks && PYTHONPATH=../src python3 bench.py engine roofline --cuda-graphs \
    --contracts tiny-dense-triton,tiny-dense-triton+walk,tiny-dense-triton+gluon,contracts/fast-baseline.toml --json "$OUT/bench_probes.json" 2>&1 \
    | grep -E "^(engine|roofline|bench)" | tee "$OUT/bench_probes.txt")
fi

# The spread decode at its defaults: its launch settings swept and each kernel's time (attention_spread.py), its bits
# and times against the walk and flash, its GPU tests, the 0.6B and 8B audits, and the engine and roofline on both
# presets with the spread decode off (+walk) beside the default and the fast baseline. About 8 minutes on an H100.
if [ "$PART" = attention-spread ]; then
(cd benchmarks && PYTHONPATH=../src timeout 150 python3 attention_spread.py blocks fold kernels --out "$OUT/attention_spread.txt" 2>&1 | grep -v -i warn)
(cd benchmarks && PYTHONPATH=../src timeout 60 python3 attention_blocks.py --sizes 1x512,1x2048,1x2000,1x8192,4x2048,4x1000,8x2048,64x512 \
    --out "$OUT/attention_blocks.txt" 2>&1 | grep -v Warning)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py 2>&1 | tail -4 | tee "$OUT/pytest_attention.txt"
for model in qwen3-0.6b-random qwen3-8b-random; do
timeout 120 python3 -m isoexec audit --device cuda --quiet --model "$model" --contract tiny-dense-triton --json "$OUT/audit_$model.json" 2>&1 \
    | tail -4 | tee "$OUT/audit_$model.txt"
done
(cd benchmarks && PYTHONPATH=../src python3 bench.py engine roofline --cuda-graphs --contracts tiny-dense-triton,tiny-dense-triton+walk,contracts/fast-baseline.toml \
    --json "$OUT/bench_spread.json" 2>&1 | grep -E "^(engine|roofline|bench)" | tee "$OUT/bench_spread.txt")
fi

# attention-profile: Nsight Compute on the calls issue 22 still misses (a 512-token prefill, decode at 64 x 512 keys) and
# on the 8,192-token prefill, each as the details page and the per-instruction stall samples (in ncu.tar); the spread
# decode's kernels at batch 1 x 8,192 and 8 x 2,048 (their speed-of-light, memory and occupancy sections); then the GPU
# attention tests with room to finish and bench.py attention (about 9 minutes on an H100).
if [ "$PART" = attention-profile ]; then
profile() {  # name, then profile_attention.py's arguments
    local name=$1; shift
    timeout 150 ncu --kernel-name regex:attention_fwd_kernel --launch-skip 2 --launch-count 1 --set full --import-source yes \
        -o "$OUT/$name" python3 benchmarks/profile_attention.py "$@" > /dev/null 2>&1
    ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
    ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_sass.csv" 2>&1
    tar -rf "$OUT/ncu.tar" -C "$OUT" "${name}_details.txt" "${name}_sass.csv" && rm "$OUT/$name.ncu-rep" "$OUT/${name}_details.txt" "$OUT/${name}_sass.csv"
}
profile prefill_512 prefill 512
profile prefill_8192 prefill 8192
profile decode_64x512 decode 64x512
for size in 1x8192 8x2048; do
    timeout 90 ncu --kernel-name regex:"block_|fold_" --launch-skip 6 --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section LaunchStats --section Occupancy python3 benchmarks/profile_attention.py decode $size > "$OUT/spread_$size.txt" 2>&1
    tar -rf "$OUT/ncu.tar" -C "$OUT" "spread_$size.txt" && rm "$OUT/spread_$size.txt"
done
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention 2>&1 | tail -4 | tee "$OUT/pytest_attention.txt"
(cd benchmarks && PYTHONPATH=../src timeout 100 python3 bench.py attention --json "$OUT/bench_attention.json" 2>&1 \
    | grep -E "^attention (prefill|decode)" | tee "$OUT/bench_attention.txt")
fi

# attention-knobs: the blocks of a tile's own positions walked checked (`attention.triton.CHECK_DIAGONAL`,
# `CHECK_DECODE_DIAGONAL`, both on) against them off, in prefill and decode at batch 16-64 (each variant's bits against
# the preset's per row), bench.py attention, then the GPU tests of the knob and the spread decode (about 5 minutes on an H100).
if [ "$PART" = attention-knobs ]; then
(cd benchmarks && PYTHONPATH=../src timeout 200 python3 attention_tiles.py --variants "diagonal=0,decode_diagonal=0;diagonal=0;decode_diagonal=0" \
    --prefill 512,2048,8192 --decode 16x2048,64x512,64x2048,64x8192 --out "$OUT/diagonal.txt" 2>&1 | grep -v -i warn)
(cd benchmarks && PYTHONPATH=../src timeout 100 python3 bench.py attention --json "$OUT/bench_attention.json" 2>&1 \
    | grep -E "^attention (prefill|decode)" | tee "$OUT/bench_attention.txt")
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k "grid or walked_checked" 2>&1 | tail -3 | tee "$OUT/pytest_knobs.txt"
fi

# attention-audits: every family's GPU audit after a change to the attention decode (CUDA-graph decode, the spread path
# where a call has few rows): the 8B-shaped one with every decode step spread (ISOEXEC_ATTENTION_BLOCKS_MIN=1) and at the
# default, the 30B-A3B- and GLM-4.7-shaped ones, the 9B- and 35B-A3B-shaped hybrids with generations over several
# chunks, then attention_tiles.py at batch 1-8 at those head shapes, the kernels' bits compared in fp32 (about 7 minutes;
# set ISOEXEC_COMMIT).
if [ "$PART" = attention-audits ]; then
audit_line() { timeout 150 python3 -m isoexec audit --device cuda --quiet "$@" 2>&1 | tail -4 | tee -a "$OUT/attention_audits.txt"; }
ISOEXEC_ATTENTION_BLOCKS_MIN=1 audit_line --model qwen3-8b-random --contract tiny-dense-triton --json "$OUT/audit_8b_every_step_spread.json"
audit_line --model qwen3-8b-random --contract tiny-dense-triton --json "$OUT/audit_8b.json"
audit_line --model qwen3-30b-a3b-4l-random --contract tiny-moe-triton --requests 16 --max-new-tokens 16 --json "$OUT/audit_30b.json"
audit_line --model glm-4.7-flash-4l-random --contract tiny-mla-triton --requests 16 --max-new-tokens 16 --json "$OUT/audit_glm.json"
for model in qwen3.5-9b-4l-random qwen3.5-35b-a3b-4l-random; do
audit_line --model "$model" --contract tiny-hybrid-triton --requests 8 --max-new-tokens 140 --json "$OUT/audit_$model.json"
done
for heads in 32,8,128 16,4,256 32,4,128; do
(cd benchmarks && PYTHONPATH=../src timeout 80 python3 attention_tiles.py --graphs --prefill "" --heads "$heads" \
    --decode 1x512,1x2048,1x8192,2x2048,4x2048,8x2048 --out "$OUT/tiles_heads_${heads//,/_}.txt" 2>&1 | grep -v -i warn)
done
fi

# attention-trees: a change to the decode path checked against another tree (OLD=<its root>, e.g. a `git archive` of an
# earlier commit's src and benchmarks): the outputs' digests of both trees diffed (attention_digests.py),
# attention_tiles.py at batch 1-8 from both, where each call's time goes (attention_timeline.py), and the spread-decode
# GPU tests (about 5 minutes).
if [ "$PART" = attention-trees ]; then
OLD=${OLD:+$(cd "$OLD" && pwd)}
(cd benchmarks && PYTHONPATH=../src timeout 60 python3 attention_digests.py > "$OUT/digests.txt" 2>&1)
if [ -n "$OLD" ]; then
    (cd benchmarks && PYTHONPATH="$OLD/src" timeout 60 python3 attention_digests.py > "$OUT/digests_old.txt" 2>&1)
    rows() { grep -v '^all' "$1" | awk '{print $1, $NF}' | uniq; }  # (size, digest); a tree that printed a size twice, once
    if diff -q <(rows "$OUT/digests_old.txt") <(rows "$OUT/digests.txt") > /dev/null; then
        echo "digests: the same as $OLD's"; else echo "digests: DIFFER from $OLD's"; fi
fi
tail -1 "$OUT/digests.txt"
SIZES="--prefill 512 --decode 1x512,1x2048,1x8192,4x2048,8x2048"
(cd benchmarks && PYTHONPATH=../src timeout 100 python3 attention_tiles.py --graphs $SIZES --out "$OUT/tiles.txt" 2>&1 | grep -v -i warn)
if [ -n "$OLD" ]; then
    (cd "$OLD/benchmarks" && PYTHONPATH=../src timeout 100 python3 attention_tiles.py --graphs $SIZES --out "$OUT/tiles_old.txt" 2>&1 | grep -v -i warn)
fi
(cd benchmarks && PYTHONPATH=../src timeout 100 python3 attention_timeline.py --out "$OUT/timeline.txt" 2>&1 | grep -v -i warn)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k 'key_blocks or outside_the_store' 2>&1 \
    | tail -3 | tee "$OUT/pytest_spread.txt"
fi

# Attention over spans (split_kv_size > 0; no preset takes it). attention-spans: the spans' decode and prefill against
# flash and split 0 (0 differing against the walk over the same spans), the 64-row tile on 8 warps, the span GPU tests
# (about 6 minutes). attention-spans-engine: the engine at 2,048-token prompts with a contract file at spans of 256
# (/tmp/spans256.json) beside the preset and the fast baseline (set ISOEXEC_COMMIT).
if [ "$PART" = attention-spans ]; then
(cd benchmarks && PYTHONPATH=../src timeout 150 python3 attention_spans.py --pairs --prefill 512,2048,8192 --out "$OUT/attention_spans.txt" 2>&1 | grep -v -i warn)
(cd benchmarks && PYTHONPATH=../src timeout 120 python3 attention_spans.py --tile num_warps=8 --decode 1x2048,8x2048,64x512 --prefill 2048,8192 \
    --out "$OUT/attention_spans_w8.txt" 2>&1 | grep -v -i warn)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k span 2>&1 | tail -4 | tee "$OUT/pytest_spans.txt"
fi

if [ "$PART" = attention-spans-engine ]; then
python3 -m isoexec contract show --preset tiny-dense-triton --json | python3 -c '
import json, sys
c = json.load(sys.stdin)
c["name"] += "-spans256"
for e in c["composition"]:
    if e["region"] == "attention":
        e["constants"]["split_kv_size"] = 256
json.dump(c, open("/tmp/spans256.json", "w"), indent=1)'
(cd benchmarks && PYTHONPATH=../src timeout 500 python3 bench.py engine --cuda-graphs --prompt-len 2048 \
    --contracts /tmp/spans256.json,tiny-dense-triton,contracts/fast-baseline.toml --json "$OUT/bench_spans.json" 2>&1 \
    | grep -E "^(engine|bench)" | tee "$OUT/bench_spans.txt")
fi

# Parallel layouts with every rank on the one GPU (issue 20 item 7): which collectives gloo and NCCL carry with CUDA
# tensors there (gloo_cuda.py), then audits at differing trainer / engine layouts, their collectives on gloo through
# host memory. The Triton contracts claim TP / EP 1 only: the audits run copies claiming more (written to /tmp/layouts),
# which is the test of whether those claims would hold. Text in parallel.txt, reports in parallel_json.tar.
if [ "$PART" = parallel ]; then
python3 benchmarks/gloo_cuda.py --json "$OUT/gloo_cuda.json" > "$OUT/gloo_cuda.txt" 2>&1
mkdir -p "$OUT/parallel" /tmp/layouts
for preset in tiny-dense-triton tiny-moe-triton; do
python3 -m isoexec contract show --preset "$preset" --json | python3 -c '
import json, sys
c = json.load(sys.stdin)
c["name"] += "-layouts"
c["claims"]["topology"] = {"tp": [1, 2, 4, 8], "ep": [1, 2, 4], "sp": [False, True]}
print(json.dumps(c, indent=1))' > "/tmp/layouts/$preset-layouts.json"
done
audit() {  # name, then isoexec audit's arguments
    local name=$1; shift
    echo "== $name: isoexec audit --device cuda --quiet $*" | tee -a "$OUT/parallel.txt"
    timeout 300 python3 -m isoexec audit --device cuda --quiet --json "$OUT/parallel/$name.json" "$@" 2>&1 | tail -7 | tee -a "$OUT/parallel.txt"
    [ -f "$OUT/parallel/$name.json" ] && tar -rf "$OUT/parallel_json.tar" -C "$OUT/parallel" "$name.json" && rm "$OUT/parallel/$name.json"
}
D=/tmp/layouts/tiny-dense-triton-layouts.json M=/tmp/layouts/tiny-moe-triton-layouts.json
audit triton_tp2_vs_1 --contract "$D" --trainer-tp 2
audit triton_tp1_vs_2 --contract "$D" --engine-tp 2
audit triton_tp4_vs_2sp --contract "$D" --trainer-tp 4 --engine-tp 2 --engine-sp
audit triton_moe_ep2_vs_1 --model tiny-moe --contract "$M" --trainer-ep 2
audit triton_moe_tp2ep2_vs_ep2 --model tiny-moe --contract "$M" --trainer-tp 2 --trainer-ep 2 --engine-ep 2
audit reference_tp2_vs_1 --contract tiny-dense --trainer-tp 2
audit native_tp2_vs_1 --contract native --trainer-tp 2
audit triton_0.6b_tp2_vs_1 --model qwen3-0.6b-random --contract "$D" --trainer-tp 2 --requests 8 --max-new-tokens 8
rmdir "$OUT/parallel"
fi
