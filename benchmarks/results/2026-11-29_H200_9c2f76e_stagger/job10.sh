#!/bin/bash
# session 16, call 10: B=32 decode with the refill rule overridden (one buffer per tile, refilled, fewer blocks)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 200 python3 .gpu/refill.py attn_global decode_b32 128,64,32 2>&1 | F > $OUT/refill.txt
cat $OUT/refill.txt
