set -u
export ISOEXEC_COMMIT=ca0ad51 PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
cd benchmarks
tiles() { PYTHONPATH=../src timeout 100 python3 attention_tiles.py --graphs --prefill "" --heads $1 --decode 1x512,1x2048,1x8192,2x2048,4x2048,8x2048 --variants "$2" --out "$OUT/occ_$3.txt" 2>&1 | grep -v -i warn; }
tiles 32,8,128 "max_waves=4;max_waves=5;max_waves=4,waves=3" 8b
tiles 16,4,256 "waves=2,max_waves=3;waves=2;max_waves=3;waves=3,max_waves=4" 9b
tiles 32,4,128 "waves=3,max_waves=4;max_waves=4;waves=3" 30b
cd ..
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k 'key_blocks or outside_the_store' 2>&1 | tail -2 | tee $OUT/pytest_spread.txt
ISOEXEC_ATTENTION_BLOCKS_MIN=1 timeout 100 python3 -m isoexec audit --device cuda --quiet --model qwen3-8b-random --contract tiny-dense-triton --json $OUT/audit_8b_blocks1.json 2>&1 | tail -3 | tee $OUT/audit_8b_blocks1.txt
