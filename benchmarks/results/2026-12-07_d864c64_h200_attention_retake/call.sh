# Issue 22's attention figures on an H200 with the code since 37b1b18 (the kept scores, programs an SM by
# occupancy): decode at batch 1-8 at three head shapes (`attention_tiles.py --graphs`, the preset against flash, with
# the 512-token prefill), then `bench.py attention` (prefill 512 / 2,048 / 8,192 tokens, decode at batch 64), then the
# spread decode's GPU tests. From the repository root, on an H200:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_d864c64_h200_attention_retake/call.sh", timeout_s=590)
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
export PYTHONUNBUFFERED=1
cd benchmarks
for h in 32,8,128 16,4,256 32,4,128; do
  [ $(left) -gt 60 ] || break
  PYTHONPATH=../src timeout 100 python3 attention_tiles.py --graphs --prefill 512 --heads $h --decode 1x512,1x2048,1x8192,2x2048,4x2048,8x2048 \
    --out "$OUT/tiles_$(echo $h | tr , _).txt" 2>&1 | grep -v -i warn
done
[ $(left) -gt 100 ] && PYTHONPATH=../src:. timeout $(( $(left) - 60 )) python3 bench.py attention --json $OUT/bench_attention.json 2>&1 | grep -v -i warn | tee $OUT/bench_attention.txt
cd ..
[ $(left) -gt 30 ] && timeout $(left) python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k 'key_blocks or outside_the_store' 2>&1 | tail -2 | tee $OUT/pytest_spread.txt
