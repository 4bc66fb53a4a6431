#!/bin/bash
# session 15, call 4: prefill with 64-row tiles, two producer blocks per SM (experimental option producer_blocks)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
V=";prefill_tile=64x64,prefill_wgmma_rows=none;prefill_tile=64x64,prefill_wgmma_rows=none,producer_blocks=2;prefill_tile=64x64,prefill_wgmma_keys=64,prefill_wgmma_rows=none,producer_blocks=2"
for S in 1024 2048 4096; do
timeout 120 python3 .gpu/tune.py attn_global,attn_causal prefill "$V" Sq=$S Skv=$S 2>&1 | F | tee -a $OUT/tune4.txt
done
timeout 100 python3 .gpu/tune.py attn_gqa,attn_norm_inside prefill "$V" Sq=2048 Skv=2048 2>&1 | F | tee -a $OUT/tune4.txt
