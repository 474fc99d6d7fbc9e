#!/bin/bash
# One device call: the terms kernel's p · V in column slices (PV_PARTS) with a register cap and more programs an SM,
# timed against the preset with bits checked (attention_tiles.py), then the 8B audit and the spread GPU tests with
# PV_PARTS=4, TERMS_MAX_REGISTERS=96, PROGRAM_WAVES=5 set in-process.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
(cd benchmarks && PYTHONPATH=../src timeout 200 python3 attention_tiles.py --graphs --prefill 512 --decode 1x512,1x2048,1x8192,4x2048,8x2048 \
    --variants "pv_parts=4;pv_parts=4,terms_regs=96,waves=5;pv_parts=4,terms_regs=96;terms_regs=96,waves=5;pv_parts=4,terms_regs=80,waves=6;pv_parts=2;fold_split=16,fold_warps=1" \
    --out "$OUT/pv.txt" 2>&1 | grep -v -i warn | grep decode)
SET='from isoexec.ops.attention import triton_blocks as t; t.PV_PARTS = 4; t.TERMS_MAX_REGISTERS = 96; t.PROGRAM_WAVES = 5'
timeout 100 python3 -c "import sys, runpy; $SET; sys.argv=['isoexec','audit','--device','cuda','--quiet','--model','qwen3-8b-random','--contract','tiny-dense-triton','--json','$OUT/audit_8b_pv.json']; runpy.run_module('isoexec', run_name='__main__')" 2>&1 | tail -6 | tee "$OUT/audit_8b_pv.txt"
timeout 120 python3 -c "import sys, pytest; $SET; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'gpu', 'tests/ops/attention/test_triton.py', '-k', 'key_blocks or outside_the_store']))" 2>&1 | tail -3 | tee "$OUT/pytest_pv.txt"
