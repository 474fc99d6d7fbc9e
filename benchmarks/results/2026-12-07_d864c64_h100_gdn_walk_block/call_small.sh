# For a short device budget, in place of call_a.sh: the backward's walks against the code by
# `profile_gdn_bwd.py --sweep` (forward + backward kernels ms under the backward's tiles, no FLA: no autotuning to
# wait for; each row's gradients against the code's): the code (0), the walks' inputs loaded (9), with the walks in
# 32 columns too (12), the walks in 32 columns alone (13: the pair that faulted in the forward kernel, last). 16 value
# heads, then 32 as DEADLINE allows. From the repository root:
#   run(command="DEADLINE=<s> ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_d864c64_h100_gdn_walk_block/call_small.sh")
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
export PYTHONUNBUFFERED=1
cd benchmarks
for shape in hk16-hv16-d128 hk16-hv32-d128; do
  [ $(left) -gt 40 ] || break
  PYTHONPATH=../src timeout $(left) python3 profile_gdn_bwd.py --sweep --configs 0,9,12,13 --shapes $shape 2>&1 | grep -v -i warn | tee -a $OUT/sweep.txt
done
