# c4d0934 (n_now) against three untimed variants: pairs (the one-token program's a/b and A_log/dt_bias as two-element
# loads), gabrun (tile loads in the wider blocks and the unsplit kernel), both. Steps by turns at batch 1-16 and FLA's;
# same bits on the GPU; the split-32 bits against the unsplit steps at batch 1-2; audit + GPU tests + bench on n_both.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1; R=$(pwd)
prof() { (cd $R/build/$1/benchmarks && PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8,16 --only "$2" 2>&1 | grep "^==" | cut -c1-110 | sed "s/^/$1 /" | tee -a $OUT/steps.txt); }
for t in n_now n_pairs n_gabrun n_both n_now n_pairs n_gabrun n_both; do prof $t "op, inverse products"; done
prof n_now fla
for t in n_now n_pairs n_gabrun n_both; do (cd build/$t && PYTHONPATH=src timeout 60 python3 $R/build/same_bits.py /tmp/bits_$t.pt cuda 2>&1 | tail -1); done
python3 -c "
import torch
b=torch.load('/tmp/bits_n_now.pt')
for t in ('n_pairs', 'n_gabrun', 'n_both'):
    a=torch.load(f'/tmp/bits_{t}.pt')
    print(t, 'same bits as n_now on the GPU:', all(torch.equal(x.view(torch.int16),y.view(torch.int16)) for x,y in zip(a,b)), len(a), 'calls', sum(x.numel() for x in a), 'values')" | tee $OUT/same_bits.txt
(cd build/n_both/benchmarks && PYTHONPATH=../src:/tmp/site timeout 90 python3 gdn_split.py --splits none,32,64 --batches 1,2,4 2>&1 | grep -v -i warn | tail -12 | tee $OUT/split_bits.txt)
cd build/n_both
for n in 2 8; do PYTHONPATH=src timeout 80 python3 -m isoexec audit --device cuda --quiet --model qwen3.5-9b-4l-random --contract tiny-hybrid-triton --requests $n --max-new-tokens 140 2>&1 | tail -3 | tee -a $OUT/audit_9b.txt; done
cp -r $R/tests $R/pyproject.toml .
PYTHONPATH=src:/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn/test_triton.py -k "qwen and contract" 2>&1 | tail -2 | tee $OUT/pytest_gdn_contract.txt
(cd benchmarks && ISOEXEC_COMMIT=93e1e6c+pairs+gabrun PYTHONPATH=../src:/tmp/site timeout 170 python3 bench.py gdn --gdn-shapes hk16-hv32-d128 --json $OUT/bench_gdn.json 2>&1 | grep -v -i warn | tee $OUT/bench_gdn.txt)
