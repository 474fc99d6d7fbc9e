# TWO_LAUNCH_MIN_RUN 128: GPU tests, shorter runs' paths, the 9B trainer at 2048 vs 128, PDL on/off, bench gdn
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 ISOEXEC_COMMIT=${ISOEXEC_COMMIT:-unknown}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
PYTHONPATH=src:/tmp/site timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn tests/model/families/test_hybrid_family.py 2>&1 | tail -6 > $R/pytest_gdn.txt; tail -3 $R/pytest_gdn.txt
cd benchmarks
PYTHONPATH=../src:.:/tmp/site timeout 60 python3 profile_gdn_fwd.py --sizes 1x128,8x128,32x64,8x64,64x32,8x32 2>&1 | grep -v Warning > $R/profile_shorter.txt; echo "profile rc=$?"
for run in 2048 128; do
  ISOEXEC_GDN_TWO_LAUNCH_MIN_RUN=$run PYTHONPATH=../src:/tmp/site timeout 100 python3 bench.py trainer --model qwen3.5-9b-4l-random --contracts tiny-hybrid-triton --trainer-reps 5 --json $R/trainer_minrun$run.json 2>&1 | grep -v Warning | tail -6 > $R/trainer_minrun$run.txt; echo "trainer $run rc=$?"
done
for pdl in 0 1; do
  ISOEXEC_PDL=$pdl PYTHONPATH=../src:.:/tmp/site timeout 60 python3 gdn_split.py --shape hk16-hv32-d128 --splits rule --batches 1,4,64 2>&1 | grep -v Warning > $R/split_pdl$pdl.txt; echo "pdl $pdl rc=$?"
done
cat $R/trainer_minrun*.txt $R/split_pdl*.txt; grep "==" $R/profile_shorter.txt
tar cf $OUT/c.tar -C $R .
PYTHONPATH=../src:/tmp/site timeout 150 python3 bench.py gdn --gdn-shapes hk16-hv32-d128 --json $OUT/bench_gdn.json 2>&1 | grep -v Warning | tail -30 > $OUT/bench_gdn.txt; echo "bench gdn rc=$?"; cat $OUT/bench_gdn.txt
