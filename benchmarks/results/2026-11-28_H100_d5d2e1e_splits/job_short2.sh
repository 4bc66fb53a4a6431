#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R; ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
CASES=attn_causal:4096,attn_alibi:4096,attn_window:4096,attn_causal:8192,attn_gqa:1024
for rnd in 1 2 3; do
  (cd $ROOT && PYTHONPATH=/tmp/site:$ROOT timeout 60 python3 .gpu/small_decode.py new $CASES 2>&1 | grep -v Warn) | tee -a $R/short_ab2.txt
  (cd $ROOT/.base && PYTHONPATH=/tmp/site:$ROOT/.base timeout 60 python3 $ROOT/.gpu/small_decode.py base $CASES 2>&1 | grep -v Warn) | tee -a $R/short_ab2.txt
done
cd $OUT && tar czf r.tgz r && rm -rf r
