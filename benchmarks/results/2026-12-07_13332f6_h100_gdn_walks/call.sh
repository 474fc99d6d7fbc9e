# The backward's walks in one launch against two, and the forward walk's 32 columns against 64, side by side on one
# machine: first the GPU gradient tests at Qwen3.5's heads (the one-launch walks checked against float64; TESTS=0
# skips them: bench.py's `grad rel diff` against FLA checks the gradients too), then `bench.py gdn --gdn-phases
# training` with ISOEXEC_GDN_BWD_WALKS=one (the default) and =two, 16 value heads first, then the prefill at
# ISOEXEC_GDN_WALK_BLOCK_V=32 (the default) and =64, as DEADLINE (default 480 s) allows. From the repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_13332f6_h100_gdn_walks/call.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"])
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-480} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
[ "${TESTS:-1}" = 0 ] || PYTHONPATH=src timeout 150 python3 -m pytest -q -m gpu tests/ops/gdn/test_triton.py -k "gradients or walks" 2>&1 | tail -4 | tee $OUT/pytest_gradients.txt
cd benchmarks
for job in "training BWD_WALKS one hk16-hv16-d128" "training BWD_WALKS two hk16-hv16-d128" "training BWD_WALKS one hk16-hv32-d128" \
  "training BWD_WALKS two hk16-hv32-d128" "prefill WALK_BLOCK_V 32 hk16-hv32-d128,hk16-hv16-d128" "prefill WALK_BLOCK_V 64 hk16-hv32-d128,hk16-hv16-d128"; do
  set -- $job
  [ $(left) -gt 40 ] || break
  echo "== $1, ISOEXEC_GDN_$2=$3, $4 ($(left) s left)" | tee -a $OUT/$1.txt
  env ISOEXEC_GDN_$2=$3 PYTHONPATH=../src:/tmp/site timeout $(left) python3 bench.py gdn --gdn-phases $1 \
    --gdn-shapes $4 --json $OUT/${1}_$3_${4%%,*}.json 2>&1 | grep -v -i warn | tee -a $OUT/$1.txt
done
