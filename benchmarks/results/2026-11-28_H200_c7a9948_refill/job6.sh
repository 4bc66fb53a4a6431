#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
timeout 300 python3 .gpu/optab4.py attn_global,attn_norm_inside,attn_gqa,attn_causal,attn_mla_decode decode 2>&1 | F | tee $R/resident_decode.txt
timeout 150 python3 .gpu/optab4.py attn_global decode_b32 2>&1 | F | tee $R/resident_b32.txt
cd $OUT && tar czf r.tgz r && rm -rf r
