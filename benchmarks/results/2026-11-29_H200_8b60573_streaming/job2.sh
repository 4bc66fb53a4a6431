#!/bin/bash
# session 12, call 2: read-only bandwidth calibration; per-kernel times of fragment decode
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 150 python3 .gpu/calib.py > $R/calib.txt 2>&1; cat $R/calib.txt
F="fragment_min_rows=16,warps=1,decode_min_split=256"
timeout 60 python3 .gpu/kprof.py attn_gqa decode "" > $R/kprof.txt 2>&1
timeout 60 python3 .gpu/kprof.py attn_gqa decode "$F,decode_tile=64" >> $R/kprof.txt 2>&1
timeout 60 python3 .gpu/kprof.py attn_global decode "" >> $R/kprof.txt 2>&1
cat $R/kprof.txt
cd $OUT && tar czf r.tgz r && rm -rf r
