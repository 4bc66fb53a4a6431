#!/bin/bash
# session 16, call 1: decode as packed one-warp blocks (text rewrite experiment)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
C=";warps=1,decode_tile=32,decode_min_split=256,decode_blocks_per_sm=32;warps=1,decode_tile=32,decode_blocks_per_sm=32;warps=1,decode_tile=64,decode_min_split=512,decode_blocks_per_sm=32;warps=1,decode_tile=16,decode_min_split=256,decode_blocks_per_sm=32"
timeout 250 python3 .gpu/pack.py attn_global decode "$C" 4,8 2>&1 | F > $OUT/pack_global.txt
timeout 200 python3 .gpu/pack.py attn_gqa,attn_causal decode "$C" 4 2>&1 | F > $OUT/pack_gqa.txt
cat $OUT/*.txt
