#!/bin/bash
# session 12, call 9: rmsnorm_amax's generated kernel with load/store cache hints (hand-edited variants)
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 200 python3 .gpu/rmsexp/rms.py $PWD/.gpu/rmsexp $PWD/polyfuse/runtime/include > $R/rms.txt 2>&1; tail -8 $R/rms.txt
cd $OUT && tar czf r.tgz r && rm -rf r
