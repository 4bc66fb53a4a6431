#!/bin/bash
# session 18, call 2: warp-split decode across the sweep's keys (for the rule)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
W="decode_warp_splits"
C=";$W=4;$W=4,decode_warp_tile=16;$W=8;$W=2"
for s in 1024 4096; do timeout 110 python3 .gpu/tune.py attn_norm_inside,attn_causal,attn_window,attn_alibi,attn_softcap decode "$C" Skv=$s 2>&1 | F >> $OUT/tune_sweep2.txt; done
for s in 1024 32768; do timeout 70 python3 .gpu/tune.py attn_global,attn_gqa decode_b32 "$C" Skv=$s 2>&1 | F >> $OUT/tune_sweep2.txt; done
cat $OUT/tune_sweep2.txt
