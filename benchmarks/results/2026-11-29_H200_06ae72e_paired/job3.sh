#!/bin/bash
# session 15, call 3: decode with tiles copied stream_stages-1 iterations ahead (working tree), one process per op
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 170 python3 .gpu/tune.py attn_global,attn_norm_inside decode ";decode_tile=64;decode_tile=64,decode_blocks_per_sm=2,stream_stages=3;decode_tile=64,decode_blocks_per_sm=2,stream_stages=4;decode_blocks_per_sm=1,stream_stages=3;decode_blocks_per_sm=1,stream_stages=4;decode_tile=64,decode_blocks_per_sm=1,stream_stages=4;decode_tile=32,stream_stages=4" 2>&1 | F | tee $OUT/tune3.txt
timeout 150 python3 .gpu/tune.py attn_gqa,attn_softcap decode ";decode_tile=64;decode_tile=32,stream_stages=4;decode_tile=64,decode_blocks_per_sm=1,stream_stages=4;decode_tile=32,stream_stages=3" 2>&1 | F | tee -a $OUT/tune3.txt
timeout 150 python3 .gpu/tune.py attn_causal,attn_window decode ";decode_tile=64,decode_blocks_per_sm=1,stream_stages=4;decode_tile=64,decode_blocks_per_sm=1,stream_stages=3;decode_tile=32,decode_blocks_per_sm=1,stream_stages=4" 2>&1 | F | tee -a $OUT/tune3.txt
