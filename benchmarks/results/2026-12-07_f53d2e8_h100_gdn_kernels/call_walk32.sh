# The walk in 32 value columns as the default: a prefill's kernels at 32 and at 64 columns side by side, then the
# training forward and forward + backward at 32 and at 64 (the second as time allows; FLA's kernels, compiled by the
# first, take little of it). From the repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_f53d2e8_h100_gdn_kernels/call_walk32.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"])
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-550} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
cd benchmarks
for job in "prefill 32" "prefill 64" "training 32" "training 64"; do
  set -- $job
  [ $(left) -gt 40 ] || break
  echo "== $1, ISOEXEC_GDN_WALK_BLOCK_V=$2 ($(left) s left)" | tee -a $OUT/$1.txt
  ISOEXEC_GDN_WALK_BLOCK_V=$2 PYTHONPATH=../src:/tmp/site timeout $(left) python3 bench.py gdn --gdn-phases $1 \
    --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/${1}_walk$2.json 2>&1 | grep -v -i warn | tee -a $OUT/$1.txt
done
