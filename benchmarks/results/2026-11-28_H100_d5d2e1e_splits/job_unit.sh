#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fold_combine.py -k "grid_of_splits or global-skv40 or mla" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -3 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -12
cd $OUT && tar czf r.tgz r && rm -rf r
