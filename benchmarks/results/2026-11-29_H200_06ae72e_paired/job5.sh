#!/bin/bash
# session 15, call 5: two producer blocks per SM (working tree: planned where they fit), with and without the late
# product (PF_DEFER_BUDGET=232: the experiment's override of the estimate), against the default 128-row tiles
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
V=";prefill_tile=64x64,prefill_wgmma_rows=none"
for S in 1024 2048 4096; do
timeout 100 python3 .gpu/tune.py attn_global,attn_norm_inside prefill "$V" Sq=$S Skv=$S 2>&1 | F | sed "s/^/[est] /" | tee -a $OUT/tune5.txt
PF_DEFER_BUDGET=232 POLYFUSE_CACHE_DIR=/tmp/pfc2 timeout 100 python3 .gpu/tune.py attn_global,attn_norm_inside prefill "$V" Sq=$S Skv=$S 2>&1 | F | sed "s/^/[late] /" | tee -a $OUT/tune5.txt
done
