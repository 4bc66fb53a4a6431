#!/bin/bash
# session 14, call 1: where a prefill block's time goes (time stamps inside blocks) and the S sweep against cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 150 python3 .gpu/stamps.py attn_global,attn_causal,attn_gqa,attn_norm_inside prefill 2>&1 | F | tee -a $R/stamps.txt
timeout 60 python3 .gpu/stamps.py attn_global,attn_causal prefill Sq=1024 Skv=1024 2>&1 | F | tee -a $R/stamps.txt
timeout 90 python3 .gpu/stamps.py attn_global,attn_causal prefill Sq=16384 Skv=16384 2>&1 | F | tee -a $R/stamps.txt
for S in 1024 2048 8192; do timeout 80 python3 .gpu/tune.py attn_global,attn_causal prefill ";" Sq=$S Skv=$S 2>&1 | F | tee -a $R/sweep.txt; done
cd $OUT && tar czf r.tgz r && rm -rf r
