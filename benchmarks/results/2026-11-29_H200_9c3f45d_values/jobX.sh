#!/bin/bash
# session 11, call 6 (tree of the commit after 10f3e35): the generic kernels' 192 rows at the bench size
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 150 python3 benchmarks/gpu_bench.py --ops attn_global,attn_norm_inside --modes prefill --no-reference --out $R/bench > $R/bench.txt 2>&1
echo "bench rc=$?"; grep -E "^\| attn" $R/bench/gpu_bench.md | cut -d'|' -f2,5,8,9,12,13,14
timeout 170 python3 benchmarks/gpu_check.py --sizes bench --inputs random,leading_zeros,special --ops attn_global --out $R/check > $R/gpu_check.txt 2>&1
echo "check rc=$?"; grep -E "OK|FAIL" $R/gpu_check.txt | tail -4
cd $OUT && tar czf r.tgz r && rm -rf r
