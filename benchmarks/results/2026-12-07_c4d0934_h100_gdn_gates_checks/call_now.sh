# c4d0934 (the one-token program's gates as scalars) against 5612015 (build/head): steps by turns at batch 1-8 and FLA's,
# the same bits on the GPU (same_bits.py), the 9B-shaped audit at 2 and 8 requests, the GPU tests at Qwen's heads; a
# variant (gtile: the slot's g and beta as one [C, 16] tile; gab: and the call's a and b as another); bench.py gdn if time is left.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1; R=$(pwd)
prof() { (cd $R/build/$1/benchmarks && PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8 --only "$2" 2>&1 | grep "^==" | cut -c1-110 | sed "s/^/$1 /" | tee -a $OUT/steps.txt); }
for t in head now gtile gab head now gtile gab; do prof $t "op, inverse products"; done
prof now fla
for t in head now gtile gab; do (cd build/$t && PYTHONPATH=src timeout 60 python3 $R/build/same_bits.py /tmp/bits_$t.pt cuda 2>&1 | tail -1); done
python3 -c "
import torch
b=torch.load('/tmp/bits_head.pt')
for t in ('now', 'gtile', 'gab'):
    a=torch.load(f'/tmp/bits_{t}.pt')
    print(t, 'same bits as head on the GPU:', all(torch.equal(x.view(torch.int16),y.view(torch.int16)) for x,y in zip(a,b)), len(a), 'calls', sum(x.numel() for x in a), 'values')" | tee $OUT/same_bits.txt
for n in 2 8; do PYTHONPATH=src timeout 80 python3 -m isoexec audit --device cuda --quiet --model qwen3.5-9b-4l-random --contract tiny-hybrid-triton --requests $n --max-new-tokens 140 2>&1 | tail -3 | tee -a $OUT/audit_9b.txt; done
PYTHONPATH=src:/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -k "qwen and contract" 2>&1 | tail -2 | tee $OUT/pytest_gdn_contract.txt
(cd benchmarks && ISOEXEC_COMMIT=c4d0934 PYTHONPATH=../src:/tmp/site timeout 170 python3 bench.py gdn --gdn-shapes hk16-hv32-d128 --json $OUT/bench_gdn.json 2>&1 | grep -v -i warn | tee $OUT/bench_gdn.txt)
