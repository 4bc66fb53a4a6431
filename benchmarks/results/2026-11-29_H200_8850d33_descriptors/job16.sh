#!/bin/bash
# session 13, call 6: the folded exponent (fold_exponent, default on) against off, same process, with cuDNN/FA2; checks
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
git log -1 --format=%H > $R/tree.txt 2>/dev/null
timeout 240 python3 .gpu/tune.py attn_global,attn_norm_inside,attn_causal,attn_gqa,attn_alibi,attn_softcap,attn_window prefill ";fold_exponent=off" 2>&1 | F | tee -a $R/fold_prefill.txt
for S in 1024 2048 8192 16384; do timeout 100 python3 .gpu/tune.py attn_global,attn_causal prefill ";fold_exponent=off" Sq=$S Skv=$S 2>&1 | F | tee -a $R/fold_sweep.txt; done
timeout 120 python3 .gpu/tune.py attn_mla_decode decode_b32 ";fold_exponent=off" 2>&1 | F | tee -a $R/fold_mla.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_exponent.py -m gpu > $R/pytest.txt 2>&1; tail -3 $R/pytest.txt
timeout 150 python3 benchmarks/gpu_check.py --sizes test --inputs all --ops attn_global,attn_causal,attn_alibi,attn_gqa,attn_softcap,attn_window,attn_norm_inside,attn_mla_decode --out $R/check > $R/gpu_check.txt 2>&1
echo "check rc=$?"; tail -1 $R/gpu_check.txt
timeout 80 compute-sanitizer --tool memcheck python3 .gpu/san.py attn_causal prefill "" > $R/san_causal.txt 2>&1; grep -hE "ERROR SUMMARY|all OK|FAILS" $R/san_causal.txt
timeout 80 compute-sanitizer --tool racecheck python3 .gpu/san.py attn_alibi prefill "" > $R/race_alibi.txt 2>&1; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|all OK|FAILS" $R/race_alibi.txt
cd $OUT && tar czf r.tgz r && rm -rf r
