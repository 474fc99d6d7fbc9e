# The backward's walks against the code, on one machine, by `bench.py gdn --gdn-phases training` (kernels ms, and each
# variant's gradients against FLA's as the check that it computes the same thing): the code; the walks' column-free
# inputs loaded from buffers (ISOEXEC_GDN_BWD_WALK_INPUTS=1); the walks in 32 value columns at chunks of 64
# (ISOEXEC_GDN_BWD_WALK_BLOCK_V=32: the pair that faulted in the forward kernel); both. 16 value heads first, then 32;
# then the GPU gradient tests at Qwen3.5's heads against float64 as the time allows. From the repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_d864c64_h100_gdn_walk_block/call_a.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"], timeout_s=590)
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
cd benchmarks
for shape in hk16-hv16-d128 hk16-hv32-d128; do
  for job in "code X=" "inputs ISOEXEC_GDN_BWD_WALK_INPUTS=1" "walk32 ISOEXEC_GDN_BWD_WALK_BLOCK_V=32" \
             "inputs_walk32 ISOEXEC_GDN_BWD_WALK_INPUTS=1 ISOEXEC_GDN_BWD_WALK_BLOCK_V=32"; do
    set -- $job
    name=$1; shift
    [ $(left) -gt 40 ] || break 2
    echo "== $shape $name: $* ($(left) s left)" | tee -a $OUT/bench.txt
    env "$@" PYTHONPATH=../src:/tmp/site timeout $(left) python3 bench.py gdn --gdn-phases training --gdn-shapes $shape \
      --json $OUT/bench_${shape}_$name.json 2>&1 | grep -v -i warn | tee -a $OUT/bench.txt
  done
done
cd ..
[ $(left) -gt 40 ] && PYTHONPATH=src timeout $(left) python3 -m pytest -q -m gpu tests/ops/gdn/test_triton.py -k "qwen_head_sizes_gradients" 2>&1 | tail -4 | tee $OUT/pytest_gradients.txt
