#!/bin/bash
# session 18, call 1: warp groups (a block's keys split again among its warps): GPU tests, sanitizer, timing sweep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/device.txt
timeout 200 python3 -m pytest -q -x tests/test_warp_groups.py -m gpu -p no:cacheprovider > $OUT/pytest_gpu.txt 2>&1
tail -5 $OUT/pytest_gpu.txt
W="decode_warp_splits"
C=";$W=8;$W=4;$W=8,decode_warp_tile=64;$W=8,decode_warp_tile=16;$W=16"
timeout 170 python3 .gpu/tune.py attn_global,attn_norm_inside,attn_causal,attn_gqa,attn_window,attn_alibi,attn_softcap decode "$C" 2>&1 | F > $OUT/tune_decode.txt
cat $OUT/tune_decode.txt
for s in 1024 4096; do timeout 60 python3 .gpu/tune.py attn_global,attn_gqa decode "$C" Skv=$s 2>&1 | F >> $OUT/tune_sweep.txt; done
timeout 80 python3 .gpu/tune.py attn_global,attn_gqa,attn_softcap decode_b32 "$C" 2>&1 | F >> $OUT/tune_sweep.txt
cat $OUT/tune_sweep.txt
for t in memcheck racecheck synccheck; do
  timeout 60 compute-sanitizer --tool $t --error-exitcode 9 python3 .gpu/sanw.py attn_window "$W=4,decode_warp_tile=16,decode_min_split=1" Skv=521 > $OUT/san_$t.txt 2>&1; echo "$t rc=$?" >> $OUT/san.txt
done
cat $OUT/san.txt
