#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 .gpu/mla_ab.py "" 32:256,16:512 2>&1 | grep -v "Warn\|image = \|^$\|ptxas warn" | tee $R/mla_check.txt
cd $OUT && tar czf r.tgz r && rm -rf r
