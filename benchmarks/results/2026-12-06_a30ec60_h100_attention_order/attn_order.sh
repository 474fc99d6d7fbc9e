# Program order and stacking for attention.triton's prefill (issue 22), one call: variants against the preset and
# flash SDPA as CUDA-graph replays.
set -x
cd benchmarks
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/device.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
PYTHONPATH=../src python3 attention_tiles.py --variants "heads_fastest=1;stack_min=133;heads_fastest=1,stack_min=133;stack_min=100000" \
  --graphs --prefill 512,1024,2048,4096,8192,8x512,4x1024,2x4096 --decode "" --out $OUT/order_8b_heads.txt
PYTHONPATH=../src python3 attention_tiles.py --variants "heads_fastest=1" --graphs --prefill 512,2048,8192,8x512 --decode "" \
  --heads 16,8,128 --out $OUT/order_06b_heads.txt
PYTHONPATH=../src python3 attention_tiles.py --variants "heads_fastest=1" --graphs --prefill 512,2048,8192 --decode "" \
  --heads 16,4,256 --out $OUT/order_9b_heads.txt
