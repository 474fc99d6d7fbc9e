# After call_a.sh, on the machine it warmed: the backward's tiles swept at both head shapes (`profile_gdn_bwd.py
# --sweep`: the walks in one launch or two, in their own narrower blocks, chunks of 32; the narrower walks last), after
# the batch 1-4 decode step with the value columns split in 16 against 32 (`gdn_split.py`, 16 value heads) and each
# training step's kernels, ours and FLA's (`profile_gdn_bwd.py --fla`). From the repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_d864c64_h100_gdn_walk_block/call_b.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"], timeout_s=590)
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
cd benchmarks
PYTHONPATH=../src:/tmp/site timeout 100 python3 gdn_split.py --shape hk16-hv16-d128 --splits none,32,16 --batches 1,2,4 \
  --json $OUT/split_hv16.json 2>&1 | grep -v -i warn | tee $OUT/split_hv16.txt
PYTHONPATH=../src:/tmp/site timeout 150 python3 profile_gdn_bwd.py --fla 2>&1 | grep -v -i warn | tee $OUT/profile_fla.txt
for shape in hk16-hv16-d128 hk16-hv32-d128; do
  [ $(left) -gt 60 ] || break
  PYTHONPATH=../src timeout $(left) python3 profile_gdn_bwd.py --sweep --shapes $shape 2>&1 | grep -v -i warn | tee -a $OUT/bwd_sweep.txt
done
