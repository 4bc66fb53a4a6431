#!/bin/bash
# session 14, call 6: fb45593: the wave rule's 192- against 128-row tiles of 64-wide heads, re-measured with staged stores
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
for S in 2048 3072 4096 8192 16384; do
  timeout 100 python3 .gpu/tune.py attn_global,attn_norm_inside prefill "prefill_wgmma_rows=192,prefill_wgmma_rows_gain=100;prefill_wgmma_rows=none" Sq=$S Skv=$S 2>&1 | F | tee -a $R/rows.txt
done
cd $OUT && tar czf r.tgz r && rm -rf r
