#!/bin/bash
# session 11, call 2: prefill time against the key loop's length at one wave (128 blocks), and the bench grid
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
for hs in "16 1024" "8 2048" "4 4096" "2 8192" "1 16384" "8 4096" "12 4096" "16 4096" "32 4096"; do
  set -- $hs
  timeout 60 python3 .gpu/tune.py attn_global prefill ";prefill_wgmma_rows=none" Hq=$1 Hkv=$1 Sq=$2 Skv=$2 >> $R/scale.txt 2>&1
done
cat $R/scale.txt
cd $OUT && tar czf r.tgz r && rm -rf r
