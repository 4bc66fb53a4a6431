#!/bin/bash
# session 9, call 3: short prefill kernels with and without TMA (host time, CUDA graph), after the cached maps and the map prefetch
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 150 python3 .gpu/small.py attn_global,attn_causal "tma=off;" 1024 2048 4096 2>&1 | F | tee $R/small.txt
(cd $OUT && tar czf r.tgz r)
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "bulk" 2>&1 | tail -3 > $R/pytest_bulk.txt
tail -1 $R/pytest_bulk.txt
timeout 50 compute-sanitizer --tool memcheck python3 .gpu/san.py attn_global prefill "" Sq=300 Skv=300 D=64 Dv=64 > $R/san_memcheck.txt 2>&1
echo "memcheck rc=$?: $(grep -E 'SUMMARY' $R/san_memcheck.txt | tail -1)" | tee -a $R/sanitizer.txt
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
