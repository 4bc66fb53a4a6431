#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "rounded_once or fragment_loops_match" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -2 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -20
V="decode_warps=8,round_operands=off;round_operands=off;paired_b=off;"
timeout 230 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_mla_decode,attn_alibi,attn_window decode "$V" 2>&1 | F | tee $R/ab_decode.txt
timeout 150 python3 benchmarks/gpu_check.py --sizes test --ops attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_mla_decode,attn_alibi,attn_window --inputs all --jobs 14 --out $R/check > $R/gpu_check.log 2>&1; echo "check rc=$?"
tail -3 $R/gpu_check.log; grep -c "^OK" $R/gpu_check.log; grep -c "^FAIL" $R/gpu_check.log
timeout 40 compute-sanitizer --tool racecheck python3 .gpu/san.py attn_causal decode "" B=1 Skv=1000 > $R/san.txt 2>&1
echo "causal racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep 'san.py' $R/san.txt | tail -1)" | tee $R/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r
