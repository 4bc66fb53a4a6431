#!/bin/bash
# session 12, call 8: the streaming GPU test (fixed: outputs by name)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_streaming.py > $R/gpu_tests2.txt 2>&1; tail -3 $R/gpu_tests2.txt
cd $OUT && tar czf r.tgz r && rm -rf r
