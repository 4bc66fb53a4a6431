#!/bin/bash
# session 15, call 2: decode tuning variants (combine columns, splits) beside cuDNN/FA2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
D=attn_global,attn_gqa,attn_norm_inside,attn_causal,attn_softcap,attn_window
C=";combine_columns=128;decode_blocks_per_sm=16;decode_blocks_per_sm=16,combine_columns=128;decode_blocks_per_sm=4,combine_columns=128;decode_min_split=512,decode_blocks_per_sm=16,combine_columns=128"
timeout 400 python3 .gpu/tune.py $D decode "$C" 2>&1 | F > $OUT/tune.txt
timeout 150 python3 .gpu/tune.py attn_global,attn_mla_decode decode_b32 ";combine_columns=128" 2>&1 | F >> $OUT/tune.txt
cat $OUT/tune.txt
