#!/bin/bash
# Issue 23: shorter decode splits where the grid would leave SMs idle (decode_short_split). This commit vs .base
# (d5d2e1e, main before) at B=1 and short caches, processes alternated twice; GPU decode tests; sanitizer.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R; ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
CASES=attn_global:1024,attn_global:4096,attn_global:8192,attn_gqa:1024,attn_gqa:4096,attn_causal:4096,attn_norm_inside:4096,attn_softcap:4096,attn_alibi:4096,attn_window:4096,attn_mla_decode:1024,attn_mla_decode:4096,attn_mla_decode:8192,attn_global:32768
for rnd in 1 2; do
  (cd $ROOT && PYTHONPATH=/tmp/site:$ROOT timeout 150 python3 .gpu/small_decode.py new $CASES $([ $rnd = 1 ] && echo --sdpa) 2>&1 | grep -v Warn) | tee -a $R/short_ab.txt
  (cd $ROOT/.base && PYTHONPATH=/tmp/site:$ROOT/.base timeout 150 python3 $ROOT/.gpu/small_decode.py base $CASES 2>&1 | grep -v Warn) | tee -a $R/short_ab.txt
done
export PYTHONPATH=/tmp/site:$ROOT
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_fold_combine.py -k "decode or fold or staging_variants" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -3 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -12
for SPEC in "attn_mla_decode --mode decode --set B=1 --set H=32 --set Skv=1024 --set Dv=512 --set Drope=64" "attn_global --mode decode --set B=1 --set Skv=1000 --set D=64 --set Dv=64"; do
  for tool in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $tool python3 -m polyfuse check $SPEC --backend cuda --inputs leading_zeros > $R/san.txt 2>&1
    echo "$SPEC $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep -iE ' ok|fail' $R/san.txt | tail -1)"
  done
done | tee $R/sanitizer.txt
cd $OUT && tar czf r.tgz r && rm -rf r
