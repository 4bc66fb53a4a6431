#!/bin/bash
# session 11, call 7 (tree fb609bb's kernels): prefill S sweep of global and causal against cuDNN / FA2 SDPA
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 230 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal --modes prefill --sizes sweep --no-compile --no-reference --out $R/sweep > $R/sweep.txt 2>&1
echo "sweep rc=$?"; grep -E "^\| attn" $R/sweep/gpu_bench.md | cut -d'|' -f2,4,5,7,10,12
cd $OUT && tar czf r.tgz r && rm -rf r
