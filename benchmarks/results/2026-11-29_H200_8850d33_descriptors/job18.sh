#!/bin/bash
# session 13, call 8: experiment: decode's partial product sum (pv_rf) kept in shared memory across the key loop
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 170 python3 .gpu/resexp.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_window decode 2>&1 | grep -v "Warn\|warn" | tee $R/resident_pv.txt
cd $OUT && tar czf r.tgz r && rm -rf r
