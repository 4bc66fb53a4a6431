#!/bin/bash
# session 16, call 5: decode of grouped heads as packed one-warp fragment blocks (text rewrite experiment)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
W="warps=1,fragment_min_rows=16,decode_blocks_per_sm=32"
C=";$W,decode_tile=16,decode_min_split=256;$W,decode_tile=32,decode_min_split=256;$W,decode_tile=16,decode_min_split=512;$W,decode_tile=32,decode_min_split=512"
timeout 280 python3 .gpu/pack.py attn_gqa,attn_softcap decode "$C" 2,4 2>&1 | F > $OUT/pack_frag.txt
timeout 200 python3 .gpu/pack.py attn_gqa decode_b32 ";$W,decode_tile=16;$W,decode_tile=32" 2,4 2>&1 | F >> $OUT/pack_frag.txt
cat $OUT/*.txt
