set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
pip install -q --no-deps --target /tmp/site build/fla_core-0.6.0-py3-none-any.whl > /dev/null 2>&1
cd build/n_slot
PYTHONPATH=src:/tmp/site timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/gdn -x 2>&1 | tail -2 | tee $OUT/pytest_gdn_gpu.txt
