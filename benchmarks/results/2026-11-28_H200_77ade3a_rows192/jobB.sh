#!/bin/bash
# session 10, call 2: padded ragged tiles + 192 query rows for 64-wide heads: correctness, sanitizer, speed
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $R/gpu.txt
V=";prefill_wgmma_rows=none"
timeout 100 python3 .gpu/tune.py attn_global,attn_norm_inside prefill "$V" 2>&1 | tee -a $R/rows.txt
timeout 100 python3 .gpu/tune.py attn_causal,attn_gqa prefill "$V" D=64 Dv=64 2>&1 | tee -a $R/rows.txt
for S in 1024 2048 8192 16384; do timeout 80 python3 .gpu/tune.py attn_global prefill "$V" Sq=$S Skv=$S 2>&1 | tee -a $R/rows.txt; done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "test_operator_matches_numpy and (attn or performer)" 2>&1 | tail -8 > $R/pytest_catalog.txt; tail -2 $R/pytest_catalog.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "late or accumulated or bulk or fragment or warpgroup" 2>&1 | tail -8 > $R/pytest_gpu.txt; tail -2 $R/pytest_gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
