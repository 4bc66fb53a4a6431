#!/bin/bash
# session 18, call 3 (29385d8): GPU tests of warp groups and the folded combine; the rule on/off across the decode sweep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/device.txt
timeout 200 python3 -m pytest -q tests/test_warp_groups.py tests/test_fold_combine.py -m gpu -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1
tail -3 $OUT/pytest_gpu.txt
OPS=attn_global,attn_norm_inside,attn_causal,attn_window,attn_alibi,attn_softcap,attn_gqa
for s in 1024 4096 32768; do timeout 100 python3 .gpu/tune.py $OPS decode ";decode_warp_splits=1" Skv=$s 2>&1 | F >> $OUT/rule_onoff.txt; done
cat $OUT/rule_onoff.txt
