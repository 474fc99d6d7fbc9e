#!/usr/bin/env bash
# The decode step's kernels for three trees taking turns: build/mid (400a6af), build/c (cacfb93), this tree; then FLA's;
# the contract-form GPU tests.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1; R=$(pwd)
for spec in "1 1,2,4,8,16" "2 1,8"; do set -- $spec; for tree in mid c after; do d=$R; [ $tree != after ] && d=$R/build/$tree
  (cd $d/benchmarks && PYTHONPATH=../src:/tmp/site timeout 100 python3 profile_gdn_decode.py --part rows --only products --batches $2 2>&1 | grep -v -i warn > $OUT/prof_${tree}_$1.txt)
  echo "$tree $1 rc=$?"; grep "^==" $OUT/prof_${tree}_$1.txt | cut -c1-100; done; done
(cd benchmarks && PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --only fla --batches 1,2,4,8,16 2>&1 | grep "^==" | tee $OUT/prof_fla.txt)
PYTHONPATH=src:/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -k "qwen and contract" 2>&1 | tail -2 | tee $OUT/pytest_gdn_contract.txt
