# On whichever GPU comes (an H200 where the H100s are held back): the two hybrid audits, then call_walk32.sh in the
# time left of DEADLINE (default 460 s). From the repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_f53d2e8_h100_gdn_kernels/call_h200.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"])
set -u
start=$(date +%s); total=${DEADLINE:-460}
for m in "qwen3.5-9b-4l-random 2" "qwen3.5-35b-a3b-4l-random 8"; do
  set -- $m; echo "== $1, $2 requests" | tee -a $OUT/audits.txt
  PYTHONPATH=src timeout 150 python3 -m isoexec audit --device cuda --quiet --model $1 --contract tiny-hybrid-triton --requests $2 --max-new-tokens 140 2>&1 | grep -v -i warn | tail -8 | tee -a $OUT/audits.txt
done
DEADLINE=$(( total - ($(date +%s) - start) )) bash benchmarks/results/2026-12-07_f53d2e8_h100_gdn_kernels/call_walk32.sh
