# The backward's walks pipelined (ISOEXEC_GDN_BWD_WALK_STAGES) against the code, on one machine. First
# `profile_gdn_bwd.py --sweep` at 16 value heads (forward + backward kernels ms, each row's gradients against the
# code's): the code (0), inputs loaded (9), pipelined (16), both (17), both at 3 stages (18), both at 8 warps (20), then the 32-column rows
# (12, 19: the pair that faulted in the forward kernel, last). Then `bench.py gdn --gdn-phases training` at 16 value
# heads for the code and for inputs loaded + 2 stages (kernel-time ratios to FLA side by side, the gradients against
# FLA's); then the same sweep at 32 value heads and the GPU gradient tests at Qwen3.5's heads (the code's walks and
# the pipelined ones with their inputs loaded), as DEADLINE allows. From the repository root:
#   run(command="DEADLINE=<s> ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-08_ce2a0a4_gdn_walk_stages/call.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"], timeout_s=590)
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
cd benchmarks
sweep() {
  [ $(left) -gt 40 ] || return
  echo "== sweep $1 ($(left) s left)" | tee -a $OUT/sweep.txt
  PYTHONPATH=../src timeout $(left) python3 profile_gdn_bwd.py --sweep --configs 0,9,16,17,18,20,12,19 --shapes $1 2>&1 | grep -v -i warn \
    | tee -a $OUT/sweep.txt
}
sweep hk16-hv16-d128
for job in "code X=" "inputs_stages2 ISOEXEC_GDN_BWD_WALK_INPUTS=1 ISOEXEC_GDN_BWD_WALK_STAGES=2"; do
  set -- $job
  name=$1; shift
  [ $(left) -gt 60 ] || break
  echo "== hk16-hv16-d128 $name: $* ($(left) s left)" | tee -a $OUT/bench.txt
  env "$@" PYTHONPATH=../src:/tmp/site timeout $(left) python3 bench.py gdn --gdn-phases training --gdn-shapes hk16-hv16-d128 \
    --json $OUT/bench_hk16-hv16-d128_$name.json 2>&1 | grep -v -i warn | tee -a $OUT/bench.txt
done
sweep hk16-hv32-d128
cd ..
[ $(left) -gt 40 ] && PYTHONPATH=src timeout $(left) python3 -m pytest -q -m gpu tests/ops/gdn/test_triton.py -k "qwen_head_sizes_gradients" \
  2>&1 | tail -4 | tee $OUT/pytest_gradients.txt
