#!/bin/bash
# session 9, call 2: TMA — libraries side by side (gpu_bench prefill + MLA B=32), S sweep A/B, gpu_check bench, GPU regression tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 200 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_window,attn_alibi,attn_mla_decode --modes prefill,decode_b32 --out $R/bench > $R/bench.log 2>&1; echo "bench rc=$?" >> $R/bench.log
tail -1 $R/bench.log; grep "^| attn" $R/bench/gpu_bench.md | cut -c1-250
(cd $OUT && tar czf r.tgz r)
for S in 1024 2048 8192 16384; do
  timeout 60 python3 .gpu/tune.py attn_global,attn_causal prefill "tma=off;" Sq=$S Skv=$S 2>&1 | F | tee -a $R/ab_sweep.txt
done
(cd $OUT && rm -f r.tgz && tar czf r.tgz r)
timeout 120 python3 benchmarks/gpu_check.py --sizes bench --ops attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_window,attn_alibi,attn_mla_decode --inputs random,leading_zeros,special --jobs 12 --out $R > $R/gpu_check_bench.log 2>&1; echo "check rc=$?" >> $R/gpu_check_bench.log
grep -E "^(FAIL|ERROR)" $R/gpu_check_bench.log | head; tail -2 $R/gpu_check_bench.log
(cd $OUT && rm -f r.tgz && tar czf r.tgz r)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "late or accumulated" 2>&1 | tail -4 > $R/pytest_late.txt
tail -2 $R/pytest_late.txt
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
