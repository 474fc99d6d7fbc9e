# 3d9bf52 (build/base) against the lead-row loads (src): bits, decode steps; then short runs' path, fewer warps, PDL off
set -u
R=$OUT/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/device.txt
cd benchmarks
PYTHONPATH=../src:.:/tmp/site timeout 150 python3 gdn_bits.py --json $R/bits_new.json 2>&1 | grep -v Warning > $R/bits_new.txt; echo "bits rc=$?"
if ! grep -q H100 $R/device.txt; then
  PYTHONPATH=../build/base/src:.:/tmp/site timeout 150 python3 gdn_bits.py 2>&1 | grep -v Warning > $R/bits_base.txt; echo "bits base rc=$?"
fi
for tree in base new base new; do
  src=../src; [ $tree = base ] && src=../build/base/src
  PYTHONPATH=$src:.:/tmp/site timeout 100 python3 gdn_split.py --shape hk16-hv32-d128 --splits none,rule --batches 1,2,4,8,64 2>&1 | grep -v Warning >> $R/split_$tree.txt; echo "split $tree rc=$?"
done
PYTHONPATH=../src:.:/tmp/site timeout 150 python3 profile_gdn_fwd.py --sizes 32x512,8x512,1x512,64x256,8x256,32x128 2>&1 | grep -v Warning > $R/profile_short.txt; echo "profile rc=$?"
PYTHONPATH=../src:.:/tmp/site timeout 100 python3 gdn_split.py --shape hk16-hv32-d128 --splits none,32 --warps 2,1 --batches 1,4 2>&1 | grep -v Warning > $R/split_warps.txt; echo "warps rc=$?"
ISOEXEC_PDL=0 PYTHONPATH=../src:.:/tmp/site timeout 60 python3 gdn_split.py --shape hk16-hv32-d128 --splits rule --batches 1,4,64 2>&1 | grep -v Warning > $R/split_pdl_off.txt; echo "pdl rc=$?"
grep -c "same bits" $R/bits_*.txt; grep -c DIFFERENT $R/bits_*.txt
grep "chunk b" $R/split_base.txt $R/split_new.txt | grep rule
cat $R/split_warps.txt $R/split_pdl_off.txt
tail -40 $R/profile_short.txt
tar cf $OUT/b.tar -C $R .
