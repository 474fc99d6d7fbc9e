# The backward's walks in their own block of value columns (ISOEXEC_GDN_BWD_WALK_BLOCK_V) against the code, on one
# machine: the GPU gradient tests at Qwen3.5's heads as the code runs them and with the walks in 32 columns (chunks
# of 64: the pair that faulted in the forward kernel), then `bench.py gdn` training + prefill at both head shapes as the
# code chooses (the rule as a whole, the walks in one launch), then training with the walks in 32 columns. From the
# repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_d864c64_h100_gdn_walk_block/call_a.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"], timeout_s=590)
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
PYTHONPATH=src timeout 150 python3 -m pytest -q -m gpu tests/ops/gdn/test_triton.py -k "gradients or walks" 2>&1 | tail -4 | tee $OUT/pytest_gradients.txt
ISOEXEC_GDN_BWD_WALK_BLOCK_V=32 PYTHONPATH=src timeout 100 python3 -m pytest -q -m gpu tests/ops/gdn/test_triton.py -k "qwen_head_sizes_gradients" 2>&1 | tail -4 | tee $OUT/pytest_gradients_walk32.txt
cd benchmarks
for job in "code training,prefill ISOEXEC_GDN_BWD_WALK_BLOCK_V=" "walk32 training ISOEXEC_GDN_BWD_WALK_BLOCK_V=32" "walk16 training ISOEXEC_GDN_BWD_WALK_BLOCK_V=16"; do
  set -- $job
  [ $(left) -gt 40 ] || break
  echo "== $1: $3 ($(left) s left)" | tee -a $OUT/bench.txt
  env $3 PYTHONPATH=../src:/tmp/site timeout $(left) python3 bench.py gdn --gdn-phases $2 \
    --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/bench_$1.json 2>&1 | grep -v -i warn | tee -a $OUT/bench.txt
done
