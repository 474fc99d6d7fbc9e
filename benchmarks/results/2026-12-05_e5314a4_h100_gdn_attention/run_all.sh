#!/usr/bin/env bash
# One device call, in priority order: bench gdn (hv32) at this tree; the attention fold sweep (4 configs); the GDN GPU
# tests; the scan-rows design's lower bound; decode over a chunk with d30fef6's tiles.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -1
R=$OUT/r; mkdir -p $R
export ISOEXEC_COMMIT=${ISOEXEC_COMMIT:-unknown} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
T=src/isoexec/ops/gdn/triton_tiles.py
cp $T /tmp/tiles_new.py
cd benchmarks
export PYTHONPATH=../src:/tmp/site
G="--gdn-shapes hk16-hv32-d128"
timeout 170 python3 bench.py gdn $G --gdn-phases training,prefill,decode-chunk --json $R/bench_gdn_new.json 2>&1 | grep -v Warning | tail -14 > $R/bench_gdn_new.txt
OUT=$R CONFIGS=${CONFIGS:-4} timeout 150 python3 attention_fold.py > $R/attn_fold.txt 2>&1
(cd .. && PYTHONPATH=src:/tmp/site timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -x 2>&1 | tail -6 > $R/pytest_gdn.txt)
[ -n "${SHORT:-}" ] || timeout 50 python3 gdn_designs.py --shapes hk16-hv32-d128 2>&1 | grep -v Warning | tail -4 > $R/gdn_designs.txt
cp ../build/dev/triton_tiles_d30fef6.py ../$T
[ -n "${SHORT:-}" ] || timeout 35 python3 bench.py gdn $G --gdn-phases decode-chunk 2>&1 | grep -v Warning | tail -8 > $R/bench_gdn_old.txt
cp /tmp/tiles_new.py ../$T
tar cf $OUT/all.tar -C $R .
cd $R && tail -n 30 device.txt bench_gdn_new.txt attn_fold.txt pytest_gdn.txt gdn_designs.txt bench_gdn_old.txt
