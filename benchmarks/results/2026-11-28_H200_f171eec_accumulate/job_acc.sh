#!/bin/bash
# Issue 22: P·V accumulated into O's registers (accumulate_products), late at d128, turns.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c "import matplotlib, tqdm" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl2/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F="grep -v Warn\|image\ =\|^$\|ptxas\ warn"
timeout 150 python3 .gpu/optab2.py attn_causal,attn_gqa,attn_alibi,attn_window,attn_softcap "accumulate_products=off;;warpgroup_turns=off;overlap_products=off" 2>&1 | grep -v "Warn\|image = \|^$\|ptxas warn" | tee $R/ab_d128.txt
timeout 60 python3 .gpu/optab2.py attn_global,attn_norm_inside "accumulate_products=off;" 2>&1 | grep -v "Warn\|image = \|^$\|ptxas warn" | tee $R/ab_d64.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "late or warpgroup_products or accumulated" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -2 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -20
for SPEC in "attn_causal --mode prefill --set Sq=256 --set Skv=256 --set D=128 --set Dv=128" "attn_window --mode prefill --set Sq=256 --set Skv=256 --set D=128 --set Dv=128 --set W=24"; do
  for tool in racecheck synccheck memcheck; do
    timeout 50 compute-sanitizer --tool $tool python3 -m polyfuse check $SPEC --backend cuda --inputs leading_zeros > $R/san.txt 2>&1
    echo "$SPEC $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep -iE ' ok|fail' $R/san.txt | tail -1)"
  done
done | tee $R/sanitizer.txt
rm -f $R/san.txt
cd $OUT && tar czf r.tgz r && rm -rf r
