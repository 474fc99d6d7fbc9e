set -u
export ISOEXEC_COMMIT=ca0ad51+rule PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
cd benchmarks
for h in 32,8,128 16,4,256 32,4,128; do
PYTHONPATH=../src timeout 80 python3 attention_tiles.py --graphs --prefill "" --heads $h --decode 1x512,1x2048,1x8192,2x2048,4x2048,8x2048 --variants "waves=4,max_waves=6" --out "$OUT/rule_$(echo $h | tr , _).txt" 2>&1 | grep -v -i warn
done
cd ..
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k 'key_blocks or outside_the_store' 2>&1 | tail -2 | tee $OUT/pytest_spread.txt
