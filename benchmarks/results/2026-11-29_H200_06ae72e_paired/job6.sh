#!/bin/bash
# session 15, call 6: paired producer blocks (working tree on c1ead2f): GPU tests, sanitizer, prefill bench + sweep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_paired_blocks.py tests/test_staged_stores.py tests/test_overlap.py > $OUT/pytest_gpu.txt 2>&1
tail -3 $OUT/pytest_gpu.txt
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --print-limit 5 python3 .gpu/san.py attn_global prefill "" Sq=300 Skv=300 D=64 Dv=64 > $OUT/san_$tool.txt 2>&1
  grep -E "ERROR SUMMARY|san.py" $OUT/san_$tool.txt | tail -2
done
timeout 110 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal --modes prefill --sizes sweep --no-reference --commit c1ead2f+paired --out $OUT/sweep > $OUT/sweep.log 2>&1
timeout 80 python3 benchmarks/gpu_bench.py --ops attn_global,attn_norm_inside,attn_causal,attn_gqa --modes prefill --no-reference --commit c1ead2f+paired --out $OUT/bench > $OUT/bench.log 2>&1
grep "^| attn" $OUT/sweep/gpu_bench.md $OUT/bench/gpu_bench.md | cut -d'|' -f2,3,4,5,9,10,13
