#!/bin/bash
# session 18, call 4 (4cfacae): warp-split decode with 16-key steps (two blocks per SM at 128-wide heads) where each
# warp rolls over many steps
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/device.txt
S="decode_warp_steps=4096"
C=";$S,decode_warp_tile=16;$S,decode_warp_tile=16,decode_warp_splits=8;$S"
for s in 4096 32768; do timeout 130 python3 .gpu/tune.py attn_global,attn_causal,attn_alibi,attn_softcap,attn_gqa decode "$C" Skv=$s 2>&1 | F >> $OUT/tile16.txt; done
cat $OUT/tile16.txt
