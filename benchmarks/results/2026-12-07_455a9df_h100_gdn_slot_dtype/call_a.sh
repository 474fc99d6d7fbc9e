set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1; R=$(pwd); BITS=$R/benchmarks/results/2026-12-06_400a6af_h100_gdn_decode_loads/same_bits.py
prof() { (cd $R/build/$1/benchmarks && PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8,16 --only "$2" 2>&1 | grep "^==" | cut -c1-110 | sed "s/^/$1 /" | tee -a $OUT/steps.txt); }
for t in n_now n_slot n_now n_slot; do prof $t "op, inverse products"; done
prof n_now fla
for t in n_now n_slot; do (cd build/$t && PYTHONPATH=src timeout 60 python3 $BITS /tmp/bits_$t.pt cuda 2>&1 | tail -1); done
python3 -c "
import torch
a, b = torch.load('/tmp/bits_n_slot.pt'), torch.load('/tmp/bits_n_now.pt')
print('n_slot same bits as n_now on the GPU:', all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(a, b)), len(a), 'calls', sum(x.numel() for x in a), 'values')" | tee $OUT/same_bits.txt
(cd build/n_slot/benchmarks && PYTHONPATH=../src:/tmp/site timeout 90 python3 gdn_split.py --splits none,32,64 --batches 1,2,4 2>&1 | grep -v -i warn | tail -12 | tee $OUT/split_bits.txt)
