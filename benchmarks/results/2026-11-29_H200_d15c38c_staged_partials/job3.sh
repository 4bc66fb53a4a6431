#!/bin/bash
# session 17, call 3: the warp-split decode experiment (wdec.py); staged partials: GPU tests, sanitizer, gpu_check
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
timeout 240 python3 .gpu/wdec.py "4,2,16,32;2,2,32,32;2,3,32,32;4,3,16,32;8,2,8,32;2,2,16,64;4,2,32,32" 2>&1 | F > $OUT/wdec.txt
cat $OUT/wdec.txt
(timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_fold_combine.py -m gpu > $OUT/pytest_fold.txt 2>&1; echo "rc=$?" >> $OUT/pytest_fold.txt) &
(timeout 250 python3 benchmarks/gpu_check.py --sizes test,bench --ops attn_global,attn_norm_inside --inputs all --out $OUT/check > $OUT/gpu_check.txt 2>&1; echo "rc=$?" >> $OUT/gpu_check.txt) &
POLYFUSE_CACHE_DIR=/tmp/pfc_san timeout 200 compute-sanitizer --tool memcheck python3 .gpu/san.py attn_global decode "" Skv=1000 > $OUT/san_memcheck.txt 2>&1
POLYFUSE_CACHE_DIR=/tmp/pfc_san timeout 200 compute-sanitizer --tool racecheck python3 .gpu/san.py attn_global decode "" Skv=1000 > $OUT/san_racecheck.txt 2>&1
POLYFUSE_CACHE_DIR=/tmp/pfc_san timeout 200 compute-sanitizer --tool synccheck python3 .gpu/san.py attn_global decode "" Skv=1000 > $OUT/san_synccheck.txt 2>&1
wait
tail -3 $OUT/pytest_fold.txt $OUT/gpu_check.txt $OUT/san_*.txt
