# before (build/base/src = 3d9bf52) and after (src) the early loads: bits and decode-step times, one run
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
cd benchmarks
for tree in base new; do
  src=../src; [ $tree = base ] && src=../build/base/src
  PYTHONPATH=$src:.:/tmp/site timeout 150 python3 gdn_bits.py --json $R/bits_$tree.json 2>&1 | grep -v Warning > $R/bits_$tree.txt; echo "bits $tree rc=$?"
done
for tree in base new base new; do
  src=../src; [ $tree = base ] && src=../build/base/src
  PYTHONPATH=$src:.:/tmp/site timeout 120 python3 gdn_split.py --shape hk16-hv32-d128 --splits none,rule --batches 1,2,4,8,16,64 2>&1 | grep -v Warning >> $R/split_$tree.txt; echo "split $tree rc=$?"
done
tail -15 $R/bits_base.txt $R/bits_new.txt
cat $R/split_base.txt $R/split_new.txt
tar cf $OUT/a.tar -C $R .
