#!/bin/bash
# session 14, call 3: checks of f8cf00d (staged epilogue stores): GPU tests, gpu_check, compute-sanitizer
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
A=attn_global,attn_causal,attn_alibi,attn_gqa,attn_softcap,attn_window,attn_norm_inside
(timeout 170 python3 benchmarks/gpu_check.py --sizes test --inputs all --jobs 6 --ops $A,attn_mla_decode --out $R/check_test > $R/gpu_check_test.txt 2>&1; echo "check test rc=$?" >> $R/gpu_check_test.txt) &
(timeout 230 python3 benchmarks/gpu_check.py --sizes bench --jobs 7 --ops $A --out $R/check_bench > $R/gpu_check_bench.txt 2>&1; echo "check bench rc=$?" >> $R/gpu_check_bench.txt) &
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_staged_stores.py tests/test_hopper_primitives.py tests/test_gpu.py -k "staged or hopper or late or bulk or accumulated" > $R/pytest.txt 2>&1; tail -3 $R/pytest.txt
wait
tail -2 $R/gpu_check_test.txt; tail -2 $R/gpu_check_bench.txt
for op in attn_causal attn_global; do
  for tool in memcheck racecheck synccheck; do
    timeout 90 compute-sanitizer --tool $tool python3 .gpu/san.py $op prefill "" > $R/san_${op}_$tool.txt 2>&1
    echo "$op $tool: $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|all OK|FAILS" $R/san_${op}_$tool.txt | tr '\n' ' ')"
  done
done | tee $R/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r
