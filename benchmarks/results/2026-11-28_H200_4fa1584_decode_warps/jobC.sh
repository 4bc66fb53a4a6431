#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
V="decode_warps=8,round_operands=off;round_operands=off;"
timeout 200 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_mla_decode,attn_alibi,attn_window decode "$V" 2>&1 | F | tee $R/ab_decode.txt
timeout 120 python3 .gpu/tune.py attn_global,attn_mla_decode,attn_norm_inside decode_b32 "$V" 2>&1 | F | tee $R/ab_b32.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "rounded_once or fragment_loops_match" tests/test_decode_groups.py tests/test_fold_combine.py > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -2 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -20
timeout 200 python3 benchmarks/gpu_check.py --sizes test,bench --ops attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_mla_decode,attn_alibi,attn_window --inputs all --jobs 14 --out $R/check > $R/gpu_check.log 2>&1; echo "check rc=$?"
tail -4 $R/gpu_check.log
for SPEC in "attn_global decode , B=1 Skv=3001 D=64 Dv=64" "attn_gqa decode ," "attn_mla_decode decode ,"; do
  set -- $SPEC
  for tool in racecheck memcheck; do
    timeout 60 compute-sanitizer --tool $tool python3 .gpu/san.py $1 $2 "" ${@:4} > $R/san.txt 2>&1
    echo "$1 $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep 'san.py' $R/san.txt | tail -1)"
  done
done | tee $R/sanitizer.txt
rm -f $R/san.txt
cd $OUT && tar czf r.tgz r && rm -rf r
