#!/bin/bash
# session 8, call 4: sum_sum at M=1024 with and without the row reciprocal (the sweep's one slower case)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
for M in 1024 2048; do timeout 60 python3 .gpu/tune.py sum_sum default "reciprocal_rows=off;" M=$M 2>&1 | F | tee -a $R/ab_1k.txt; done
for o in on off; do
  timeout 60 ncu --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats -k regex:polyfuse_ -s 1 -c 1 python3 .gpu/one.py sum_sum default reciprocal_rows=$o M=1024 > $R/ncu_$o.txt 2>&1
  cuobjdump -sass /tmp/pfcache 2>/dev/null | head -0
done
grep -E "Duration|DRAM Through|Registers Per|Achieved Occ|Block Size|Grid Size|Warp Cycles Per Issued" $R/ncu_on.txt $R/ncu_off.txt
cd $OUT && tar czf r.tgz r && rm -rf r
