#!/bin/bash
# session 16, call 6: 88b612e (staggered loops): GPU tests, gpu_check, compute-sanitizer, same-process timing, bench
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
(timeout 200 python3 benchmarks/gpu_check.py --sizes test,bench --ops moe_routing --inputs all --out $OUT/check > $OUT/gpu_check.txt 2>&1; echo "rc=$?" >> $OUT/gpu_check.txt) &
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_stagger.py > $OUT/pytest.txt 2>&1
wait
tail -3 $OUT/pytest.txt $OUT/gpu_check.txt
POLYFUSE_CACHE_DIR=/tmp/pfc_san timeout 150 compute-sanitizer --tool memcheck python3 .gpu/san.py moe_routing default "" > $OUT/san_memcheck.txt 2>&1
POLYFUSE_CACHE_DIR=/tmp/pfc_san timeout 150 compute-sanitizer --tool racecheck python3 .gpu/san.py moe_routing default "" > $OUT/san_racecheck.txt 2>&1
tail -3 $OUT/san_*.txt
COMPILE=1 timeout 150 python3 .gpu/tune.py moe_routing default ";stagger_loops=off" 2>&1 | F > $OUT/tune.txt; cat $OUT/tune.txt
timeout 150 python3 benchmarks/gpu_bench.py --ops moe_routing,rmsnorm_amax,layernorm_stats --no-reference --commit 88b612e --out $OUT/bench > $OUT/bench.log 2>&1
rm -f $OUT/*/*.png
grep "^| moe\|^| rms\|^| layer\|^| copy" $OUT/bench/gpu_bench.md
