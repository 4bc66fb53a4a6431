#!/bin/bash
# Issue 22: the two computing warpgroups of prefill issue their products in turns (warpgroup_turns).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c "import matplotlib, tqdm" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl2/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
# 1. A/B at the bench sizes (same process, alternating), bits compared.
timeout 200 python3 .gpu/optab.py attn_causal,attn_global,attn_gqa,attn_norm_inside,attn_alibi,attn_softcap,attn_window warpgroup_turns 2>&1 | grep -v Warn | tee $R/turns_ab.txt
# 2. GPU tests of the warpgroup loop (turns on by default) and the bit comparison.
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "turns or warpgroup_products or warpgroup_widths" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -3 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -12
# 3. compute-sanitizer on prefill kernels with turns (128-row blocks, a masked last tile).
for SPEC in "attn_causal --mode prefill --set Sq=300 --set Skv=300 --set D=128 --set Dv=128" "attn_global --mode prefill --set Sq=260 --set Skv=390 --set D=64 --set Dv=64"; do
  for tool in racecheck synccheck memcheck; do
    timeout 60 compute-sanitizer --tool $tool python3 -m polyfuse check $SPEC --backend cuda --inputs leading_zeros > $R/san.txt 2>&1
    echo "$SPEC $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep -iE ' ok|fail' $R/san.txt | tail -1)"
  done
done | tee $R/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r
