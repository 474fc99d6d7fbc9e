set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
cd build/n_slot
for n in 2 8; do PYTHONPATH=src timeout 80 python3 -m isoexec audit --device cuda --quiet --model qwen3.5-9b-4l-random --contract tiny-hybrid-triton --requests $n --max-new-tokens 140 2>&1 | tail -3 | tee -a $OUT/audit_9b.txt; done

(cd benchmarks && ISOEXEC_COMMIT=n_slot PYTHONPATH=../src:/tmp/site timeout 300 python3 bench.py gdn --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/bench_gdn.json 2>&1 | grep -v -i warn | tee $OUT/bench_gdn.txt)
