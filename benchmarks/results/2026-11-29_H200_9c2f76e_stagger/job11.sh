#!/bin/bash
# session 16, call 11: staggered loops that copy their tiles ahead (a user's f16 GEMM): GPU tests, racecheck, timing
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_stagger.py > $OUT/pytest.txt 2>&1
tail -2 $OUT/pytest.txt
POLYFUSE_CACHE_DIR=/tmp/pfc_san timeout 60 compute-sanitizer --tool racecheck python3 .gpu/gemm16.py small > $OUT/san_racecheck.txt 2>&1
tail -4 $OUT/san_racecheck.txt
timeout 60 python3 .gpu/gemm16.py > $OUT/gemm16.txt 2>&1
cat $OUT/gemm16.txt
