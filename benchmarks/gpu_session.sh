#!/usr/bin/env bash
# Everything the GPU records in benchmarks/RESULTS.md come from: gpu_checks.sh (GPU tests, admission,
# audits), bench.py with CUDA graphs (every section, three contracts), the decode kernels under the
# contract and the fast baseline, and the host cost of a launch. The device machine returns only a few files,
# so everything is written under $OUT/r and packed into $OUT/results.tgz.
#
#   ISOEXEC_COMMIT=<sha> OUT=out bash benchmarks/gpu_session.sh [checks|bench]     # from the repository root
#
# With `checks` or `bench` it runs only that half (~6 and ~8 minutes on one H200), for devices that
# limit one call to 10 minutes. Results worth keeping go in benchmarks/results/ as
# <date>_<commit>_<section>.json or a <date>_<commit>_<section>/ folder (index: benchmarks/results/README.md).
set -u
OUT=${OUT:-gpu_out}
PART=${1:-all}
R="$OUT/r"
mkdir -p "$R"
export PYTHONPATH=src:benchmarks PYTHONUNBUFFERED=1

if [ "$PART" != bench ]; then
OUT="$R" timeout 540 bash benchmarks/gpu_checks.sh > "$R/checks.log" 2>&1
grep -E "passed|failed|admitted, |audit:|tokens equal|trainer_|every sampled|MISMATCH|trace:" "$R/checks.log" | cut -c1-160
fi
if [ "$PART" != checks ]; then
timeout 300 python3 benchmarks/bench.py --cuda-graphs --json "$R/results.json" > "$R/bench.log" 2>&1
grep -v "^gemm\|^attention" "$R/bench.log" | cut -c1-250
timeout 120 python3 benchmarks/profile_gpu.py decode-kernels > "$R/profile.log" 2>&1
grep -A 12 "==" "$R/profile.log" | cut -c1-140
timeout 60 python3 benchmarks/profile_gpu.py launch > "$R/launch.log" 2>&1
tail -21 "$R/launch.log"
fi
tar czf "$OUT/results.tgz" -C "$OUT" r && rm -rf "$R"
