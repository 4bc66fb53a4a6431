#!/bin/bash
# session 17, call 1: where the folded combine's time goes (stamps at its barriers); one column block
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/device.txt
timeout 150 python3 .gpu/dstamps2.py attn_global,attn_norm_inside decode - 2>&1 | F > $OUT/stamps_default.txt
timeout 150 python3 .gpu/dstamps2.py attn_global decode combine_columns=64 2>&1 | F > $OUT/stamps_cols64.txt
timeout 200 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa decode ";combine_columns=64;combine_columns=128" 2>&1 | F > $OUT/tune_cols.txt
cat $OUT/*.txt
