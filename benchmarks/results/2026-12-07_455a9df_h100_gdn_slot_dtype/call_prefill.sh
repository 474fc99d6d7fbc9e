# Not yet run: GDN training and prefill by device time alone (bench.py gdn's `*_kernels_ms`, added after this folder's
# calls), with the two-launch walk in blocks of 64 value columns (the default) and of 32 (twice the programs: a
# prefill of one run has 1 x 32 heads x 2 blocks = 64 walks on 132 SMs; the same bits whatever the block). From the
# repository root at d6a89d7 or later:
#   run(command="OUT=$OUT bash benchmarks/results/2026-12-07_455a9df_h100_gdn_slot_dtype/call_prefill.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"]); ~300 s cold.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
cd benchmarks
for walk in 64 32; do
  echo "== ISOEXEC_GDN_WALK_BLOCK_V=$walk" | tee -a $OUT/prefill_kernels.txt
  ISOEXEC_GDN_WALK_BLOCK_V=$walk ISOEXEC_COMMIT=${ISOEXEC_COMMIT:-unknown} PYTHONPATH=../src:/tmp/site timeout 280 python3 bench.py gdn \
    --gdn-phases training,prefill --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/prefill_walk$walk.json 2>&1 | grep -v -i warn | tee -a $OUT/prefill_kernels.txt
done
