# Ran at f53d2e8 (results: ../2026-12-07_f53d2e8_h100_gdn_kernels/). The code at d36700a: GDN training forward and forward + backward by the kernels' device time (bench.py gdn's
# `*_kernels_ms`) at both head shapes, then the decode step over a chunk at both head shapes, the contract and FLA by
# turns. From the repository root, on the machine call_audits_prefill.sh warmed:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_455a9df_h100_gdn_slot_dtype/call_training_steps.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"])
set -u
start=$(date +%s); left() { echo $(( 570 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
cd benchmarks
PYTHONPATH=../src:/tmp/site timeout 300 python3 bench.py gdn --gdn-phases training \
  --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/training.json 2>&1 | grep -v -i warn | tee -a $OUT/training.txt
for shape in hk16-hv32-d128 hk16-hv16-d128 hk16-hv32-d128 hk16-hv16-d128; do
  for only in "op, inverse products" fla; do
    [ $(left) -gt 30 ] || break 2
    PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8,16 --shape $shape --only "$only" 2>&1 | grep "^==" | cut -c1-110 | sed "s/^/$shape /" | tee -a $OUT/steps.txt
  done
done
