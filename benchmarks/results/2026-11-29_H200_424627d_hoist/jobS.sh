#!/bin/bash
# session 11, call 1: the divisor hoisted out of attention's divide-inside sum (GpuTuning.hoist_divisors)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
# 1. hoisted (default) against the divide-inside repair, same process, with cuDNN / FA2 SDPA
for p in prefill decode decode_b32; do
  timeout 150 python3 .gpu/tune.py attn_norm_inside,attn_global $p ";hoist_divisors=False" >> $R/ab.txt 2>&1
done
timeout 120 python3 .gpu/tune.py attn_norm_inside prefill ";hoist_divisors=False" Sq=16384 Skv=16384 >> $R/ab.txt 2>&1
cat $R/ab.txt
# 2. correctness: test sizes every input, bench sizes random + leading zeros; sanitizer on the test-size kernels
timeout 200 python3 benchmarks/gpu_check.py --sizes test --inputs all --ops attn_norm_inside,attn_global --out $R/check_test > $R/gpu_check_test.txt 2>&1
echo "check test rc=$?: $(grep -c ' OK' $R/gpu_check_test.txt) OK, $(grep -c 'FAIL' $R/gpu_check_test.txt) FAIL"
for m in prefill decode; do
  timeout 90 compute-sanitizer --tool memcheck python3 .gpu/san.py attn_norm_inside $m "" > $R/san_mem_$m.txt 2>&1
  timeout 90 compute-sanitizer --tool racecheck python3 .gpu/san.py attn_norm_inside $m "" > $R/san_race_$m.txt 2>&1
  echo "san $m: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|all OK|FAILS' $R/san_*_$m.txt | tr '\n' ' ')"
done
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_hoist_divisor.py -k "norm_inside or hoist" > $R/pytest.txt 2>&1; tail -3 $R/pytest.txt
# 3. the library table for both forms' operators (FlexAttention and torch.compile included)
timeout 240 python3 benchmarks/gpu_bench.py --ops attn_norm_inside,attn_global --modes prefill,decode --no-reference --out $R/bench > $R/bench.txt 2>&1
echo "bench rc=$?"; grep -E "^\|" $R/bench/gpu_bench.md | head -20
cd $OUT && tar czf r.tgz r && rm -rf r
