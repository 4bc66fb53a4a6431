#!/bin/bash
# session 17, call 2: staged partials in the folded combine (A/B), folding four column blocks
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 150 python3 .gpu/tune.py attn_global,attn_norm_inside decode ";stage_partials=off" 2>&1 | F > $OUT/tune_staged.txt
timeout 250 python3 .gpu/tune.py attn_causal,attn_alibi,attn_window decode ";fold_serial=4;fold_serial=4,stage_partials=off" 2>&1 | F > $OUT/tune_fold4.txt
timeout 150 python3 .gpu/tune.py attn_gqa,attn_softcap decode ";fold_serial=4" 2>&1 | F > $OUT/tune_fold4_unstaged.txt
timeout 100 python3 .gpu/dstamps2.py attn_global decode - 2>&1 | F > $OUT/stamps_staged.txt
cat $OUT/*.txt
