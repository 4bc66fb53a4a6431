#!/bin/bash
# session 14, call 5: fb45593: staged-store GPU tests again (fixed test), compute-sanitizer on the other prefill kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
for op in attn_gqa attn_norm_inside attn_alibi attn_softcap attn_window; do
  ( for tool in memcheck racecheck synccheck; do
      timeout 150 compute-sanitizer --tool $tool python3 .gpu/san.py $op prefill "" > $R/san_${op}_$tool.txt 2>&1
      echo "$op $tool: $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|all OK|FAILS" $R/san_${op}_$tool.txt | tr '\n' ' ')" >> $R/sanitizer.txt
    done ) &
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_staged_stores.py tests/test_gpu.py -k "staged or fragment or warpgroup or widths or staging" > $R/pytest.txt 2>&1; tail -3 $R/pytest.txt
wait
sort $R/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r
