#!/bin/bash
# session 13, call 3: experiment: log2 e folded into one FFMA per score (text rewrite) against the kernels as generated
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 200 python3 .gpu/foldexp.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_alibi,attn_window prefill 2>&1 | F | tee -a $R/fold.txt
timeout 100 python3 .gpu/foldexp.py attn_global,attn_causal prefill Sq=16384 Skv=16384 2>&1 | F | tee -a $R/fold.txt
timeout 60 python3 .gpu/foldexp.py attn_global prefill Sq=1024 Skv=1024 2>&1 | F | tee -a $R/fold.txt
cd $OUT && tar czf r.tgz r && rm -rf r
