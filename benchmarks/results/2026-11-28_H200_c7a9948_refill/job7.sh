#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
timeout 270 python3 benchmarks/gpu_check.py --sizes bench --ops attn_global,attn_norm_inside,attn_causal,attn_window,inertia,performer --inputs random,leading_zeros,special --jobs 10 --out $R > $R/gpu_check_bench.log 2>&1; echo "check rc=$?"
grep -E "^(FAIL|ERROR)" $R/gpu_check_bench.log | head; tail -2 $R/gpu_check_bench.log
cd $OUT && tar czf r.tgz r && rm -rf r
