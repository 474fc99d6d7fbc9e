# Not yet run: a57d91d's decode step at both head shapes on whichever GPU comes (an H200 gives the figures issue 19 has not been retaken on). From the
# repository root at a57d91d or later: run(command="OUT=$OUT bash benchmarks/results/2026-12-07_455a9df_h100_gdn_slot_dtype/call_next.sh",
#   carry=["build/fla_core-0.6.0-py3-none-any.whl", "build/n_tr"])   # pip download fla-core==0.6.0 --no-deps -d build, if build/ lost it
# build/n_tr (optional: the probe below), from the repository root:
#   rm -rf build/n_tr; mkdir build/n_tr; cp -r src benchmarks pyproject.toml build/n_tr/; rm -rf build/n_tr/benchmarks/results
#   (cd build/n_tr && patch -p1 < ../../benchmarks/results/2026-12-07_455a9df_h100_gdn_slot_dtype/delta_tr_probe.patch)
# ~450 s cold; then, on the same machine, `bench.py gdn --gdn-shapes hk16-hv32-d128` and `--gdn-shapes hk16-hv16-d128` as
# two calls (each ~160 s cold).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
export PYTHONUNBUFFERED=1
cd benchmarks
for shape in hk16-hv32-d128 hk16-hv16-d128 hk16-hv32-d128 hk16-hv16-d128; do
  for only in "op, inverse products" fla; do
    PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4,8,16 --shape $shape --only "$only" 2>&1 | grep "^==" | cut -c1-110 | sed "s/^/$shape /" | tee -a $OUT/steps.txt
  done
done
# Blocks of 16 columns against 32 where a step has few programs (16 value heads: 16 unsplit programs at batch 1), the
# same bits (the split's own check); they lost at batch 1 before the one-token program existed (66c61d8).
for shape in hk16-hv16-d128 hk16-hv32-d128; do
  PYTHONPATH=../src:/tmp/site timeout 90 python3 gdn_split.py --shape $shape --splits 16,32 --batches 1,2 2>&1 | grep -v -i warn | tail -6 | tee -a $OUT/split16.txt
done
# The probe (delta_tr_probe.patch, other bits, not a contract form): the 32-column program computes delta as
# T (beta v - (beta e^c k) S0), so k S0 runs beside the inverse and W goes; the repository's tree and n_tr by turns.
R=$(cd .. && pwd)
if [ -d $R/build/n_tr ]; then
  for shape in hk16-hv32-d128 hk16-hv16-d128; do
    for tree in $R $R/build/n_tr $R $R/build/n_tr; do
      (cd $tree/benchmarks && PYTHONPATH=../src:/tmp/site timeout 60 python3 profile_gdn_decode.py --part rows --batches 1,2,4 --shape $shape --only "op, inverse products" 2>&1 | grep "^==" | cut -c1-110 | sed "s#^#$shape ${tree#$R} #" | tee -a $OUT/probe_steps.txt)
    done
  done
fi
