#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
timeout 70 python3 .gpu/optab3.py attn_softcap prefill "reciprocal_constants=off;" 2>&1 | F | tee $R/ab_softcap.txt
timeout 40 python3 .gpu/optab3.py attn_softcap decode "reciprocal_constants=off;" 2>&1 | F | tee -a $R/ab_softcap.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_reciprocal.py > $R/pytest_gpu.txt 2>&1; echo "pytest rc=$?"; tail -1 $R/pytest_gpu.txt
timeout 90 python3 benchmarks/gpu_check.py --sizes test,bench --ops attn_softcap,variance,layernorm_stats,rmsnorm_amax,inertia --inputs all --jobs 12 --out $R > $R/gpu_check.log 2>&1; echo "check rc=$?"; tail -1 $R/gpu_check.log; grep -E "^(FAIL|ERROR)" $R/gpu_check.log | head -5
cd $OUT && tar czf r.tgz r && rm -rf r
