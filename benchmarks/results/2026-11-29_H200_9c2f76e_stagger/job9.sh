#!/bin/bash
# session 16, call 9: decode tiles and split rule at B=32 (no copy-ahead there) and causal B=1, beside cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 200 python3 .gpu/tune.py attn_global,attn_norm_inside decode_b32 ";decode_tile=32;decode_tile=64;decode_wave_gain=5;decode_tile=32,decode_wave_gain=5;decode_tile=64,decode_wave_gain=5" 2>&1 | F > $OUT/tune_b32.txt
timeout 150 python3 .gpu/tune.py attn_causal,attn_gqa decode ";decode_tile=32;decode_tile=64" 2>&1 | F > $OUT/tune_b1.txt
cat $OUT/*.txt
