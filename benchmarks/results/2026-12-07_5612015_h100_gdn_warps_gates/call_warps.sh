# Split decode programs at 8 and 16 warps (gdn_split.py: time per step over a chunk and bits against the unsplit steps);
# gates (the one-token program's gate inputs as scalars); w8gates (the split rule with 32-column programs on 8 warps, and
# the scalar gates): its rule timed, the 9B audit at 2 requests (the 32-column split in CUDA graphs), the GPU tests of the
# split at Qwen's heads; then three smaller variants (reread, skip, tok64).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1 ISOEXEC_COMMIT=5612015; R=$(pwd)
split() {  # name tree splits warps batches timeout
  (cd $2/benchmarks && PYTHONPATH=../src:/tmp/site timeout $6 python3 gdn_split.py --splits $3 --warps "$4" --batches $5 --json /tmp/j_$1.json 2>&1 \
    | grep -v -i warn | sed "s/^/$1 /" | tee -a $OUT/split.txt)
}
split head $R none,32,64 8,16 1,2,4 170
split gates $R/build/gates none,32 8 1,2 60
split w8gates $R/build/w8gates none,rule "" 1,2,4,8 60
(cd build/w8gates
PYTHONPATH=src timeout 80 python3 -m isoexec audit --device cuda --quiet --model qwen3.5-9b-4l-random --contract tiny-hybrid-triton --requests 2 --max-new-tokens 140 2>&1 | tail -3 | tee $OUT/audit_9b_w8gates.txt
PYTHONPATH=src:/tmp/site timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -k "qwen and contract and split" 2>&1 | tail -3 | tee $OUT/pytest_w8gates.txt)
tar -cf $OUT/json.tar -C /tmp $(cd /tmp && ls j_*.json 2>/dev/null)
split reread $R/build/reread none,32 8 1 40
split skip $R/build/skip none,32 8 1 40
split tok64 $R/build/tok64 none,64 8 1,2,4 60
tar -cf $OUT/json.tar -C /tmp $(cd /tmp && ls j_*.json 2>/dev/null)
