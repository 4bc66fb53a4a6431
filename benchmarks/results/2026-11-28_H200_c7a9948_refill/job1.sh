#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
timeout 200 python3 .gpu/optab3.py attn_global,attn_norm_inside,attn_gqa,attn_softcap,attn_causal,attn_mla_decode decode "refill_tiles=off;;force_refill=on" 2>&1 | F | tee $R/ab_decode.txt
timeout 100 python3 .gpu/optab3.py attn_global,attn_norm_inside decode_b32 "refill_tiles=off;force_refill=on" 2>&1 | F | tee $R/ab_b32.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "staging_variants" tests/test_fold_combine.py tests/test_decode_groups.py > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -2 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -20
for SPEC in "attn_global decode stream_ahead=off B=1 Skv=3001 D=64 Dv=64" "attn_causal decode stream_ahead=off B=2 Skv=1000" "attn_mla_decode decode stream_ahead=off"; do
  for tool in racecheck synccheck memcheck; do
    timeout 60 compute-sanitizer --tool $tool python3 .gpu/san.py $SPEC > $R/san.txt 2>&1
    echo "$SPEC $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep 'san.py' $R/san.txt | tail -1) | $(grep -c 'into the buffer' $R/san.txt)"
  done
done | tee $R/sanitizer.txt
rm -f $R/san.txt
cd $OUT && tar czf r.tgz r && rm -rf r
