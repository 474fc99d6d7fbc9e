# Not yet run: a57d91d's audits that did not fit this folder's calls (the device time ran out). From the repository
# root at a57d91d or later: run(command="OUT=$OUT bash benchmarks/results/2026-12-07_455a9df_h100_gdn_slot_dtype/call_audits.sh"); ~250 s cold.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
for m in "qwen3.5-9b-4l-random 2" "qwen3.5-35b-a3b-4l-random 8"; do
  set -- $m; echo "== $1, $2 requests" | tee -a $OUT/audits.txt
  PYTHONPATH=src timeout 150 python3 -m isoexec audit --device cuda --quiet --model $1 --contract tiny-hybrid-triton --requests $2 --max-new-tokens 140 2>&1 | grep -v -i warn | tail -8 | tee -a $OUT/audits.txt
done
