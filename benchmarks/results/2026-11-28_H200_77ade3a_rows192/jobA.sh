#!/bin/bash
# session 10, call 1: 192 query rows (three computing warpgroups) against 128, sizes divisible by both
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $R/gpu.txt
V=";prefill_tile=192x64"
for S in 3072 6144; do
  timeout 150 python3 .gpu/tune.py attn_global,attn_norm_inside prefill "$V" Sq=$S Skv=$S 2>&1 | tee -a $R/rows.txt
done
timeout 100 python3 .gpu/tune.py attn_causal,attn_gqa prefill "$V" Sq=3072 Skv=3072 D=64 Dv=64 2>&1 | tee -a $R/rows.txt
timeout 100 python3 .gpu/tune.py attn_global prefill "$V" 2>&1 | tee -a $R/rows.txt
cd $OUT && tar czf r.tgz r && rm -rf r
