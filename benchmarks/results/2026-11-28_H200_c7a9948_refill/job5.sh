#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
OPS=attn_global,attn_norm_inside,attn_gqa,attn_causal,attn_softcap,attn_mla_decode
for rnd in 1 2; do
  for tree in base new; do
    if [ $tree = base ]; then P=$PWD/.base; else P=$PWD; fi
    PYTHONPATH=/tmp/site:$P POLYFUSE_CACHE_DIR=/tmp/pfcache_$tree timeout 150 python3 .gpu/optab3.py $OPS decode "" 2>&1 | F | sed "s/^/$tree r$rnd /" | tee -a $R/ab_trees.txt
  done
done
export PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfcache
timeout 330 python3 benchmarks/gpu_check.py --sizes test --inputs all --jobs 14 --out $R/check > $R/gpu_check.log 2>&1; echo "check rc=$?"
tail -5 $R/gpu_check.log
cd $OUT && tar czf r.tgz r && rm -rf r
