#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
timeout 100 python3 benchmarks/gpu_bench.py --ops attn_gqa,attn_norm_inside --modes decode --no-compile --out $R/b1 2>&1 | F | tail -1
timeout 100 python3 benchmarks/gpu_bench.py --ops attn_gqa,attn_norm_inside --modes decode --no-compile --no-reference --out $R/b2 2>&1 | F | tail -1
timeout 100 python3 .gpu/optab3.py attn_gqa,attn_norm_inside decode "refill_tiles=off;" 2>&1 | F | tee $R/ab.txt
grep -h "^| attn" $R/b1/gpu_bench.md $R/b2/gpu_bench.md | cut -d'|' -f2-5,8-10
cd $OUT && tar czf r.tgz r && rm -rf r
