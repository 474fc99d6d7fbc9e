# Ran at f53d2e8 (results: ../2026-12-07_f53d2e8_h100_gdn_kernels/). The code at d36700a (GDN kernels of a57d91d): the Qwen3.5-9B- and 35B-A3B-shaped audits, then GDN prefill timed by the
# kernels' device time alone (bench.py gdn's `*_kernels_ms`), the two-launch walk in blocks of 64 value columns (the
# default) and of 32 and 16 (the last as time allows; the same bits whatever the block). From the repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_455a9df_h100_gdn_slot_dtype/call_audits_prefill.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"])
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-520} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
for m in "qwen3.5-9b-4l-random 2" "qwen3.5-35b-a3b-4l-random 8"; do
  set -- $m; echo "== $1, $2 requests" | tee -a $OUT/audits.txt
  PYTHONPATH=src timeout 150 python3 -m isoexec audit --device cuda --quiet --model $1 --contract tiny-hybrid-triton --requests $2 --max-new-tokens 140 2>&1 | grep -v -i warn | tail -8 | tee -a $OUT/audits.txt
done
cd benchmarks
for walk in 64 32 16; do
  [ $(left) -gt 40 ] || break
  echo "== ISOEXEC_GDN_WALK_BLOCK_V=$walk ($(left) s left)" | tee -a $OUT/prefill_kernels.txt
  ISOEXEC_GDN_WALK_BLOCK_V=$walk PYTHONPATH=../src:/tmp/site timeout $(left) python3 bench.py gdn --gdn-phases prefill \
    --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/prefill_walk$walk.json 2>&1 | grep -v -i warn | tee -a $OUT/prefill_kernels.txt
done
