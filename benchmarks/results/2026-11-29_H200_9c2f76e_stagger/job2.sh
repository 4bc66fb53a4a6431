#!/bin/bash
# session 16, call 2: packed one-warp decode blocks, more configurations (double-buffered tiles, 8+ warps per SM)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
W="warps=1,decode_blocks_per_sm=32"
C=";$W,decode_tile=32,decode_min_split=512;$W,decode_tile=16,decode_min_split=512;$W,decode_tile=32;$W,decode_tile=64"
timeout 250 python3 .gpu/pack.py attn_global decode "$C" 2,4,8 2>&1 | F > $OUT/pack_global.txt
C=";$W,decode_tile=32,decode_min_split=512;$W,decode_tile=32;$W,decode_tile=64"
timeout 250 python3 .gpu/pack.py attn_gqa,attn_causal decode "$C" 2,4 2>&1 | F > $OUT/pack_gqa.txt
cat $OUT/*.txt
