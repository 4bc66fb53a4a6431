#!/bin/bash
# session 16, call 3: moe_routing gate tiles (rows x hidden step) and warps, beside torch.compile
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
C=";gate_tile=32x256;gate_tile=32x128;gate_tile=16x128;gate_tile=32x64;gate_tile=64x128;gate_tile=32x256,warps=4;gate_tile=32x128,warps=4;gate_tile=16x256,warps=4;gate_tile=64x64"
COMPILE=1 timeout 300 python3 .gpu/tune.py moe_routing default "$C" 2>&1 | F > $OUT/moe.txt
cat $OUT/*.txt
