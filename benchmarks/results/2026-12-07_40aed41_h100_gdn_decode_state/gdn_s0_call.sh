# The decode step with the start state loaded after the piece's inputs (after, after2: and the first piece's slot rows by
# the slot read first), against HEAD (build/before); FLA's step; the same bits on the GPU; the 9B-shaped audit.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1; R=$(pwd)
tree() { case $1 in before) echo $R/build/before;; after2) echo $R/build/after2;; *) echo $R;; esac; }
for t in before after after2 before after; do
  (cd $(tree $t)/benchmarks && PYTHONPATH=../src:/tmp/site timeout 75 python3 profile_gdn_decode.py --part rows --batches 1,2,4 --only "op, inverse products" 2>&1 | grep "^==" | cut -c1-110 | sed "s/^/$t /" | tee -a $OUT/steps.txt)
done
(cd benchmarks && PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4 --only "fla" 2>&1 | grep "^==" | cut -c1-110 | tee -a $OUT/steps.txt)
for t in before after after2; do (cd $(tree $t) && PYTHONPATH=src timeout 40 python3 $R/build/same_bits.py /tmp/bits_$t.pt cuda 2>&1 | tail -1); done
python3 -c "
import torch
b=torch.load('/tmp/bits_before.pt')
for t in ('after', 'after2'):
    a=torch.load(f'/tmp/bits_{t}.pt')
    print(t, 'same bits as before on the GPU:', all(torch.equal(x.view(torch.int16),y.view(torch.int16)) for x,y in zip(a,b)), len(a), 'calls', sum(x.numel() for x in a), 'values')" | tee $OUT/same_bits.txt
PYTHONPATH=src timeout 100 python3 -m isoexec audit --device cuda --quiet --model qwen3.5-9b-4l-random --contract tiny-hybrid-triton --requests 8 --max-new-tokens 140 2>&1 | tail -3 | tee $OUT/audit_9b.txt
