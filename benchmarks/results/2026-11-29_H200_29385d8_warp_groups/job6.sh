#!/bin/bash
# session 18, call 6 (4901a0b): compute-sanitizer on warp groups of several warps (named barriers) and on more
# iterations than groups
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
python3 .gpu/sanb.py 8 2 > $OUT/plain_8_2.txt 2>&1; tail -1 $OUT/plain_8_2.txt   # (builds the cache)
python3 .gpu/sanb.py 2 8 > $OUT/plain_2_8.txt 2>&1; tail -1 $OUT/plain_2_8.txt
for t in memcheck racecheck synccheck; do
  timeout 45 compute-sanitizer --tool $t --error-exitcode 9 python3 .gpu/sanb.py 8 2 > $OUT/san_${t}_8_2.txt 2>&1; echo "$t 8x2 rc=$?" >> $OUT/san.txt
done
timeout 45 compute-sanitizer --tool racecheck --error-exitcode 9 python3 .gpu/sanb.py 2 8 > $OUT/san_racecheck_2_8.txt 2>&1; echo "racecheck 2x8 rc=$?" >> $OUT/san.txt
cat $OUT/san.txt; grep -h "ERROR SUMMARY" $OUT/san_*.txt
