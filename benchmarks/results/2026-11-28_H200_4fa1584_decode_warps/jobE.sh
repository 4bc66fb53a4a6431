#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "row_groups_give_the_same_bits" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -2 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -20
(cd $OUT && tar czf r.tgz r)
timeout 110 python3 .gpu/tune.py attn_global,attn_softcap,attn_norm_inside,attn_causal,attn_window decode "row_groups=off;" 2>&1 | F | tee $R/ab_decode.txt
(cd $OUT && tar czf r.tgz r)
timeout 90 python3 benchmarks/gpu_check.py --sizes test --ops attn_global,attn_causal,attn_norm_inside,attn_softcap,attn_alibi,attn_window,inertia,performer --inputs all --jobs 14 --out $R/check > $R/gpu_check.log 2>&1; echo "check rc=$?"
grep "summary" $R/gpu_check.log; grep "^FAIL\|^ERROR" $R/gpu_check.log | head
(cd $OUT && tar czf r.tgz r)
timeout 40 compute-sanitizer --tool racecheck python3 .gpu/san.py attn_softcap decode "" Skv=512 > $R/san.txt 2>&1
echo "softcap racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep 'san.py' $R/san.txt | tail -1)" | tee $R/sanitizer.txt
rm -f $R/san.txt
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
