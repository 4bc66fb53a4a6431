#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
timeout 150 python3 benchmarks/gpu_check.py --sizes test --ops attn_causal,attn_gqa,attn_alibi,attn_window,attn_softcap,attn_global,attn_norm_inside,attn_mla_decode --inputs all --jobs 14 > $R/gpu_check_bench_d128.log 2>&1
echo "check rc=$?"; grep -cE " OK" $R/gpu_check_bench_d128.log; grep -E "FAIL|ERROR" $R/gpu_check_bench_d128.log | head; tail -3 $R/gpu_check_bench_d128.log
cd $OUT && tar czf r.tgz r && rm -rf r
