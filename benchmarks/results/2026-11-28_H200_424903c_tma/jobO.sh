#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
timeout 120 python3 .gpu/prof.py > $R/prof.txt 2>&1; grep "per call" $R/prof.txt
cd $OUT && tar czf r.tgz r && rm -rf r
