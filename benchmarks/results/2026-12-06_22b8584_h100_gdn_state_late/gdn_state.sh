#!/usr/bin/env bash
# One device call: a GDN decode step's kernels before (build/before = 80a88d2) and after (this tree: the start state
# read after the first piece's row loads), taking turns; the same bits on the GPU.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1; R=$(pwd)
for tree in after before; do d=$R; [ $tree = before ] && d=$R/build/before
  (cd $d/benchmarks && PYTHONPATH=../src:/tmp/site timeout 80 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8,16 2>&1 | grep -v -i warn > $OUT/prof_${tree}.txt)
  echo "$tree rc=$?"; grep "^==" $OUT/prof_${tree}.txt | cut -c1-100; done
for tree in before after; do d=$R; [ $tree = before ] && d=$R/build/before; (cd $d && PYTHONPATH=src timeout 40 python3 $R/build/same_bits.py $OUT/bits_$tree.pt cuda 2>&1 | tail -1); done
python3 -c "
import torch
a=torch.load('$OUT/bits_after.pt');b=torch.load('$OUT/bits_before.pt')
print('same bits on the GPU:', all(torch.equal(x.view(torch.int16),y.view(torch.int16)) for x,y in zip(a,b)), len(a), 'calls', sum(x.numel() for x in a), 'values')" | tee $OUT/same_bits.txt
rm -f $OUT/bits_*.pt
