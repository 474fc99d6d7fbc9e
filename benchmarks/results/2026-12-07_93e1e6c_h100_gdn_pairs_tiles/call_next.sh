# Untimed: slot_dtype_untimed.patch (the slot keeps k and v in the input dtype, so a row's k or v is one load from the
# slot or the call) against the code it applies to. Prepare, from the repository root at the commit this folder came with:
#   for t in n_now n_slot; do rm -rf build/$t; mkdir build/$t; cp -r src benchmarks tests pyproject.toml build/$t/; rm -rf build/$t/benchmarks/results; done
#   (cd build/n_slot && patch -p1 < ../../benchmarks/results/2026-12-07_93e1e6c_h100_gdn_pairs_tiles/slot_dtype_untimed.patch)
#   pip download fla-core==0.6.0 --no-deps -d build   # if build/ lost the wheel
# then: run(command="OUT=$OUT bash benchmarks/results/2026-12-07_93e1e6c_h100_gdn_pairs_tiles/call_next.sh",
#           carry=["build/n_now", "build/n_slot", "build/fla_core-0.6.0-py3-none-any.whl"])
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
cd build/n_slot
(cd benchmarks && PYTHONPATH=../src:/tmp/site timeout 90 python3 gdn_split.py --splits none,32,64 --batches 1,2,4 2>&1 | grep -v -i warn | tail -12 | tee $OUT/split_bits.txt)
for n in 2 8; do PYTHONPATH=src timeout 80 python3 -m isoexec audit --device cuda --quiet --model qwen3.5-9b-4l-random --contract tiny-hybrid-triton --requests $n --max-new-tokens 140 2>&1 | tail -3 | tee -a $OUT/audit_9b.txt; done
PYTHONPATH=src:/tmp/site timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn -x 2>&1 | tail -2 | tee $OUT/pytest_gdn_gpu.txt
(cd benchmarks && ISOEXEC_COMMIT=n_slot PYTHONPATH=../src:/tmp/site timeout 300 python3 bench.py gdn --gdn-shapes hk16-hv32-d128,hk16-hv16-d128 --json $OUT/bench_gdn.json 2>&1 | grep -v -i warn | tee $OUT/bench_gdn.txt)
