# From the repository root. (1) the spread decode's max kernel over several blocks a product (MAX_RUN) against the preset;
# (2) HEADS_FASTEST on (58a0003): bench.py attention, the 8B audit, the attention GPU tests touching the walk and the
# spread decode. Each step bounded so a slow one leaves the rest.
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/device.txt
export PYTHONPATH=src
(cd benchmarks && PYTHONPATH=../src timeout 170 python3 attention_tiles.py --variants "max_run=2;max_run=4;max_run=8;max_run=4,max_waves=4;max_run=4,max_waves=8" --prefill "" --decode 1x512,1x2048,1x8192,4x2048,8x2048,16x2048 --out $OUT/max_run.txt > /dev/null 2>&1)
cut -c1-600 $OUT/max_run.txt
(cd benchmarks && PYTHONPATH=../src timeout 120 python3 bench.py attention --json $OUT/bench_attention.json > $OUT/bench_attention.txt 2>&1)
tail -22 $OUT/bench_attention.txt
timeout 110 python3 -m isoexec audit --device cuda --quiet --model qwen3-8b-random --contract tiny-dense-triton --json $OUT/audit_qwen3-8b-random.json > $OUT/audit_qwen3-8b-random.txt 2>&1
tail -4 $OUT/audit_qwen3-8b-random.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k "launch_order or decode_rows_equal_training or long_decode_rows_with_their_key_blocks or walked_checked or captured" > $OUT/pytest_attention.txt 2>&1
tail -4 $OUT/pytest_attention.txt
