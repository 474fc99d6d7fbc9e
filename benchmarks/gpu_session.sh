#!/usr/bin/env bash
# Everything the GPU records in benchmarks/RESULTS.md come from, in one device call (~7 minutes on one
# H200): gpu_checks.sh (GPU tests, admission, audits), bench.py with CUDA graphs, bench.py's engine and
# roofline without --cuda-graphs, and the decode and training-step profiles. The device machine returns only a few files,
# so everything is written under $OUT/r and packed into $OUT/results.tgz.
#
#   ISOEXEC_COMMIT=<sha> OUT=out bash benchmarks/gpu_session.sh [checks|bench]     # from the repository root
#
# With `checks` or `bench` it runs only that half (~4 and ~6 minutes), for devices that limit one call
# to 10 minutes.
set -u
OUT=${OUT:-gpu_out}
PART=${1:-all}
R="$OUT/r"
mkdir -p "$R"
export PYTHONPATH=src:benchmarks PYTHONUNBUFFERED=1

if [ "$PART" != bench ]; then
OUT="$R" timeout 300 bash benchmarks/gpu_checks.sh > "$R/checks.log" 2>&1
grep -E "passed|failed|admitted, |audit:|tokens equal|trainer_|every sampled|MISMATCH|trace:" "$R/checks.log" | cut -c1-160
fi
if [ "$PART" != checks ]; then
timeout 160 python3 benchmarks/bench.py --cuda-graphs --json "$R/results.json" > "$R/bench.log" 2>&1
timeout 70 python3 benchmarks/bench.py engine roofline --json "$R/results_native_eager.json" > "$R/bench_eager.log" 2>&1
grep -v "^gemm\|^attention" "$R/bench.log" | cut -c1-200
timeout 90 python3 benchmarks/profile_gpu.py decode > "$R/profile.log" 2>&1
grep -A 12 "kernels of one" "$R/profile.log" | cut -c1-140
timeout 100 python3 benchmarks/profile_gpu.py trainer > "$R/profile_trainer.log" 2>&1
grep "==" "$R/profile_trainer.log" | cut -c1-200
fi
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
