#!/bin/bash
# session 12, call 10: rows that write their rows (rmsnorm_amax, layernorm_stats): warps per block, register budget
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
COMPILE=1 ROUNDS=4 timeout 280 python3 .gpu/tune.py rmsnorm_amax,layernorm_stats,softmax default ";warps=4;warps=16;warps=32;row_registers=32;min_blocks=4" > $R/rows_warps.txt 2>&1; grep "us x\|Error" $R/rows_warps.txt
cd $OUT && tar czf r.tgz r && rm -rf r
