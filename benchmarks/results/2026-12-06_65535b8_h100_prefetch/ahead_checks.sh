# From the repository root. The spread decode's slots a step ahead (max kernel) and its prefetches, and the walk's
# prologue prefetch, each off against the preset (all on); the attention GPU tests; bench.py attention.
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/device.txt
export PYTHONPATH=src
(cd benchmarks && PYTHONPATH=../src timeout 240 python3 attention_tiles.py --graphs --variants "max_ahead=0,prefetch=0,prologue=0;max_ahead=1,prefetch=0;max_ahead=0,prefetch=1;prologue=0" --prefill 512,2048,8x512 --decode 1x512,1x2048,1x8192,4x2048,8x2048,64x512 --out $OUT/ahead.txt > /dev/null 2>&1)
cut -c1-800 $OUT/ahead.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/attention/test_triton.py -k "key_blocks_over_the_grid or captured or launch_order or decode_rows_equal_training" > $OUT/pytest_attention.txt 2>&1
tail -4 $OUT/pytest_attention.txt
(cd benchmarks && PYTHONPATH=../src timeout 90 python3 bench.py attention --json $OUT/bench_attention.json > $OUT/bench_attention.txt 2>&1)
tail -22 $OUT/bench_attention.txt
