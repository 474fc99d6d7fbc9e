# Not yet run (written after the device time ran out). The code after 13332f6 (the backward's walks in one launch; the
# forward walk's block by WALK_NARROW): the GPU gradient tests at Qwen3.5's heads (the one-launch walks against
# float64), `bench.py gdn --gdn-phases training,prefill` at both head shapes as the code chooses, then with
# ISOEXEC_GDN_WALK_NARROW=off (64 columns always) and with ISOEXEC_GDN_BWD_WALKS=two, then the backward's tiles swept at
# 16 value heads (`profile_gdn_bwd.py --sweep`: the walks in one launch or two, chunks of 32 with blocks of 32), as
# DEADLINE (default 540 s) allows. From the repository root:
#   run(command="ISOEXEC_COMMIT=<the tree's commit> OUT=$OUT bash benchmarks/results/2026-12-07_13332f6_h100_gdn_walks/call_next.sh",
#       carry=["build/fla_core-0.6.0-py3-none-any.whl"], timeout_s=580)
set -u
start=$(date +%s); left() { echo $(( ${DEADLINE:-540} - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
PYTHONPATH=src timeout 150 python3 -m pytest -q -m gpu tests/ops/gdn/test_triton.py -k "gradients or walks" 2>&1 | tail -4 | tee $OUT/pytest_gradients.txt
cd benchmarks
for job in "code ISOEXEC_GDN_WALK_NARROW=" "narrow_off ISOEXEC_GDN_WALK_NARROW=off" "walks_two ISOEXEC_GDN_BWD_WALKS=two"; do
  set -- $job
  [ $(left) -gt 60 ] || break
  echo "== $1: $2 ($(left) s left)" | tee -a $OUT/training_prefill.txt
  env $2 PYTHONPATH=../src:/tmp/site timeout $(left) python3 bench.py gdn --gdn-phases training,prefill \
    --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/training_prefill_$1.json 2>&1 | grep -v -i warn | tee -a $OUT/training_prefill.txt
done
[ $(left) -gt 60 ] && PYTHONPATH=../src timeout $(left) python3 profile_gdn_bwd.py --sweep --shapes hk16-hv16-d128 2>&1 | grep -v -i warn | tee $OUT/bwd_sweep.txt
