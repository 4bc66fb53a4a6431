#!/bin/bash
# session 12, call 11: moe_routing's generated kernel, hand-edited: x prefetched a step ahead, two mma chains
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
timeout 200 python3 .gpu/moeexp/moe.py $PWD/.gpu/moeexp $PWD/polyfuse/runtime/include > $R/moe.txt 2>&1; tail -12 $R/moe.txt
cd $OUT && tar czf r.tgz r && rm -rf r
