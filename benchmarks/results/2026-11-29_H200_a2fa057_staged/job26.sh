#!/bin/bash
# session 14, call 8: a2fa057: gpu_bench prefill (the four issue-22 entries) and the S sweep, written straight to $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
timeout 90 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal,attn_gqa,attn_norm_inside --modes prefill --no-reference --commit a2fa057 --out $OUT/bench > $OUT/bench.log 2>&1
timeout 100 python3 benchmarks/gpu_bench.py --ops attn_causal,attn_global --modes prefill --sizes sweep --no-reference --commit a2fa057 --out $OUT/sweep > $OUT/sweep.log 2>&1
grep "^| attn" $OUT/bench/gpu_bench.md $OUT/sweep/gpu_bench.md | cut -d'|' -f2,4,5,9,10,13
