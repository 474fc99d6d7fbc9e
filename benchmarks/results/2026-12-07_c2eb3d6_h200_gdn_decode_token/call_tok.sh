# The one-token decode program by straight-line code (_token) against HEAD (build/before): steps at batch 1-16 by turns,
# FLA's, the same bits on the GPU (same_bits.py), the 9B-shaped audit, the GPU tests at Qwen's heads.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1; R=$(pwd)
tree() { case $1 in before) echo $R/build/before;; after2) echo $R/build/after/alt;; *) echo $R/build/after;; esac; }
for t in before after2 before after2; do
  (cd $(tree $t)/benchmarks && PYTHONPATH=../src:/tmp/site timeout 70 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8 --only "op, inverse products" 2>&1 | grep "^==" | cut -c1-110 | sed "s/^/$t /" | tee -a $OUT/steps.txt)
done
(cd benchmarks && PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8 --only "fla" 2>&1 | grep "^==" | cut -c1-110 | tee -a $OUT/steps.txt)
for t in before after2; do (cd $(tree $t) && PYTHONPATH=src timeout 60 python3 $R/build/same_bits.py /tmp/bits_$t.pt cuda 2>&1 | tail -1); done
python3 -c "
import torch
b=torch.load('/tmp/bits_before.pt')
for t in ('after2',):
    a=torch.load(f'/tmp/bits_{t}.pt')
    print(t, 'same bits as before on the GPU:', all(torch.equal(x.view(torch.int16),y.view(torch.int16)) for x,y in zip(a,b)), len(a), 'calls', sum(x.numel() for x in a), 'values')" | tee $OUT/same_bits.txt
cd build/after/alt; PYTHONPATH=src timeout 100 python3 -m isoexec audit --device cuda --quiet --model qwen3.5-9b-4l-random --contract tiny-hybrid-triton --requests 8 --max-new-tokens 140 2>&1 | tail -3 | tee $OUT/audit_9b.txt
PYTHONPATH=src:/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -k "qwen and contract" 2>&1 | tail -3 | tee $OUT/pytest_gdn_contract.txt
