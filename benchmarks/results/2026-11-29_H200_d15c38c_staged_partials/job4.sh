#!/bin/bash
# session 17, call 4: the warp-split decode experiment at B=1 (more configurations) and at B=32 (d128, no split)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 240 python3 .gpu/wdec.py decode "8,2,8,32;8,3,8,32;4,2,16,32;4,4,8,32;6,2,8,32;8,2,16,32;4,2,8,32" 2>&1 | F > $OUT/wdec_b1.txt
timeout 300 python3 .gpu/wdec.py decode_b32 "2,2,1,32;4,2,1,32;1,4,1,32;2,3,1,32;1,3,1,32;1,2,1,32" 2>&1 | F > $OUT/wdec_b32.txt
cat $OUT/*.txt
