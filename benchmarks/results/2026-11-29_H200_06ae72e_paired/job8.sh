#!/bin/bash
# session 15, call 8: 06ae72e: gpu_bench of every prefill entry and the S sweep (causal, global), written to $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
timeout 190 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal --modes prefill --sizes sweep --no-reference --commit 06ae72e --out $OUT/sweep > $OUT/sweep.log 2>&1
timeout 200 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_alibi,attn_softcap,attn_window --modes prefill --no-reference --commit 06ae72e --out $OUT/bench > $OUT/bench.log 2>&1
rm -f $OUT/*/*.png
ls $OUT/*
