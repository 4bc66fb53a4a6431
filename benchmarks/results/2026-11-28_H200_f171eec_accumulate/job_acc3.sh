#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c "import matplotlib, tqdm" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl2/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "late" > $R/pytest_gpu_late.txt 2>&1
echo "pytest rc=$?"; tail -2 $R/pytest_gpu_late.txt; grep -E "^FAILED" $R/pytest_gpu_late.txt | head -20
timeout 330 python3 benchmarks/gpu_bench.py --ops attn_causal,attn_gqa,attn_alibi,attn_window,attn_softcap,attn_global,attn_norm_inside --modes prefill --out $R/bench > $R/bench.log 2>&1; echo "bench rc=$?"
grep -h '^| attn' $R/bench/gpu_bench.md | cut -d'|' -f2,5,7,8,9,10,11,12,13,14
rm -f $R/bench/*.png
cd $OUT && tar czf r.tgz r && rm -rf r
