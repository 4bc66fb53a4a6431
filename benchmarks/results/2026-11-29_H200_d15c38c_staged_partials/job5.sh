#!/bin/bash
# session 17, call 5: the existing one-warp decode plan with enough splits to fill the SMs (one wave of warps)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 300 python3 .gpu/tune.py attn_global decode ";decode_warps=1,decode_tile=32,decode_min_split=512;decode_warps=1,decode_tile=32,decode_min_split=256;decode_warps=1,decode_tile=64,decode_min_split=512;decode_warps=2,decode_tile=32,decode_min_split=512;decode_warps=1,decode_tile=32,decode_min_split=512,decode_blocks_per_sm=16" 2>&1 | F > $OUT/tune_onewarp.txt
cat $OUT/*.txt
