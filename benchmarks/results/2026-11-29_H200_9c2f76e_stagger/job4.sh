#!/bin/bash
# session 16, call 4: moe_routing gate loop with rotated step order per block (L2 hot spot test)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 300 python3 .gpu/rot.py 2>&1 | F > $OUT/rot.txt
cat $OUT/*.txt
