#!/bin/bash
# session 17, call 9: shorter splits for the decode entries that fill few blocks (GQA: 256 blocks on 132 SMs)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 250 python3 .gpu/tune.py attn_gqa,attn_softcap,attn_causal decode ";decode_min_split=512;decode_min_split=256;decode_min_split=512,decode_tile=64" 2>&1 | F > $OUT/tune_split.txt
cat $OUT/tune_split.txt
