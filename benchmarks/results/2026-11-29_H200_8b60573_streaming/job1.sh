#!/bin/bash
# session 12, call 1: decode in warp fragments (1-warp blocks) against the default decode kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
F="fragment_min_rows=16,warps=1,decode_min_split=256"
timeout 250 python3 .gpu/tune.py attn_gqa,attn_softcap decode ";$F,decode_tile=64,decode_blocks_per_sm=16;$F,decode_tile=32,decode_blocks_per_sm=16;$F,decode_tile=64,decode_blocks_per_sm=8;$F,decode_tile=32,decode_blocks_per_sm=32;$F,decode_tile=64,decode_blocks_per_sm=32" > $R/frag_decode.txt 2>&1
cat $R/frag_decode.txt
timeout 120 python3 .gpu/tune.py attn_gqa decode ";$F,decode_tile=64,decode_blocks_per_sm=16;$F,decode_tile=32,decode_blocks_per_sm=16" Skv=4096 > $R/frag_decode_4096.txt 2>&1
cat $R/frag_decode_4096.txt
cd $OUT && tar czf r.tgz r && rm -rf r
