#!/bin/bash
# session 15, call 9: 42afa57: the divide-inside form unhoisted (GpuTuning(hoist_divisors=False)), pair vs 128 rows
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
for S in 1024 2048; do
timeout 70 python3 .gpu/tune.py attn_norm_inside prefill "hoist_divisors=False;hoist_divisors=False,prefill_pair_rows=128" Sq=$S Skv=$S 2>&1 | F | tee -a $OUT/tune9.txt
done
