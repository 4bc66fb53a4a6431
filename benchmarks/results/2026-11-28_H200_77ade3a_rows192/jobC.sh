#!/bin/bash
# session 10, call 3 (tree 77ade3a): the wave rule's choices against 128 rows; GPU tests of the late/accumulated/bulk paths
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $R/gpu.txt
git log --oneline -1 > $R/commit.txt 2>/dev/null
V=";prefill_wgmma_rows=none"
for S in 3072 6144 16384; do timeout 80 python3 .gpu/tune.py attn_global,attn_norm_inside prefill "$V" Sq=$S Skv=$S 2>&1 | tee -a $R/rule.txt; done
timeout 80 python3 .gpu/tune.py attn_causal prefill "$V" Sq=8192 Skv=8192 D=64 Dv=64 2>&1 | tee -a $R/rule.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "late or accumulated or bulk" 2>&1 | tail -6 > $R/pytest_gpu.txt; tail -2 $R/pytest_gpu.txt
cd $OUT && tar czf r.tgz r && rm -rf r
