#!/bin/bash
# session 11, call 4 (tree 9c3f45d): 192 against 128 query rows after the fragment-value rewrites
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
V="prefill_wgmma_rows_gain=40;prefill_wgmma_rows=none"
for s in 1024 2048 3072 4096 8192; do
  timeout 60 python3 .gpu/tune.py attn_global prefill "$V" Sq=$s Skv=$s >> $R/rows.txt 2>&1
done
timeout 60 python3 .gpu/tune.py attn_causal prefill "$V" D=64 Dv=64 >> $R/rows.txt 2>&1
timeout 60 python3 .gpu/tune.py attn_gqa prefill "$V" D=64 Dv=64 >> $R/rows.txt 2>&1
timeout 60 python3 .gpu/tune.py attn_causal prefill "$V" D=64 Dv=64 Sq=8192 Skv=8192 >> $R/rows.txt 2>&1
cat $R/rows.txt
cd $OUT && tar czf r.tgz r && rm -rf r
